"""autogen: a code-generating CUDA kernel autotuner.

    import autogen
    y = autogen.sgemv(A, x)                      # CuPy arrays or PyTorch CUDA tensors
    k = autogen.lookup("sgemv", m=16384, n=16)   # k.name, k.params, k.served_by, k.provenance
    y = k(A, x, alpha=2.0, beta=0.5, y=y)
    total = autogen.reduce_sum(v)                # fp32 or fp16 vector, fp32 sum
    p = autogen.softmax(scores)                  # rows x cols, fp32 or fp16
"""

__version__ = "0.1.0"


def sgemv(A, x, alpha=1.0, beta=0.0, y=None, *, stream=None):
    """y = alpha * A x + beta * y with the best kernel autogen has for this GPU and shape."""
    return _dispatch().call("sgemv", (A, x, alpha, beta, y), _NO_KWARGS, stream)


def reduce_sum(x, *, stream=None):
    """Sum of a 1-D fp32 or fp16 CUDA array, accumulated in fp32; a 0-d float32 array."""
    return _dispatch().call("reduce", (x,), _NO_KWARGS, stream)


def softmax(x, out=None, *, stream=None):
    """Softmax over the last dimension of a 2-D fp32 or fp16 CUDA array (rows x cols)."""
    return _dispatch().call("softmax", (x, out), _NO_KWARGS, stream)


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
