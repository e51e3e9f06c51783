"""autogen: a code-generating CUDA kernel autotuner.

    import autogen
    y = autogen.sgemv(A, x)                      # CuPy arrays or PyTorch CUDA tensors
    k = autogen.lookup("sgemv", m=16384, n=16)   # k.name, k.params, k.served_by, k.provenance
    y = k(A, x, alpha=2.0, beta=0.5, y=y)
"""

__version__ = "0.1.0"


def sgemv(A, x, alpha=1.0, beta=0.0, y=None, *, stream=None):
    """y = alpha * A x + beta * y with the best kernel autogen has for this GPU and shape."""
    return _dispatch().call("sgemv", (A, x, alpha, beta, y), _NO_KWARGS, stream)


def _dispatch():
    # Imported on first use: `import autogen` needs neither CuPy nor a database.
    global _dispatch_module
    if _dispatch_module is None:
        from . import dispatch
        _dispatch_module = dispatch
    return _dispatch_module


_dispatch_module = None
_NO_KWARGS: dict = {}


def lookup(family, dtype=None, strict=False, **dims):
    """The kernel served for `family` at this shape: exact, nearest, arch or default."""
    from .dispatch import lookup as _lookup
    return _lookup(family, dtype, strict, **dims)
