"""autogen: a code-generating CUDA kernel autotuner.

    import autogen
    y = autogen.sgemv(A, x)                      # CuPy arrays or PyTorch CUDA tensors
    k = autogen.lookup("sgemv", m=16384, n=16)   # k.name, k.params, k.served_by, k.provenance
    y = k(A, x, alpha=2.0, beta=0.5, y=y)

Every family with a Python call (`Family.api`) is reachable as autogen.<api>: autogen.sgemv,
autogen.reduce_sum, autogen.softmax and the rest (`autogen.all_families()` lists them). A family of
your own is a Family subclass decorated with @autogen.register (see README, "Tune your own kernel").
"""

from autogen._version import __version__  # noqa: E402

from autogen.core.family import Family, Launch, Peer, Step, Trait
from autogen.core.kernel_family import kernel_family  # noqa: E402  (a kernel tuned by tune_kernel, defined again)
from autogen.core.registry import all_families, get_family, register  # noqa: E402
from autogen.core.space import Param, Space  # noqa: E402


def lookup(family, dtype=None, strict=False, **dims):
    """The kernel served for `family` at this shape: exact, nearest, arch or default."""
    from autogen.runtime.dispatch import lookup as _lookup
    return _lookup(family, dtype, strict, **dims)


def call(family, *args, stream=None, pdl=False, **kwargs):
    """Run `family` (any registered name, e.g. "mykernels.axpy") on these operands with the
    best kernel autogen has for this GPU and shape."""
    from autogen.runtime.dispatch import call as _call
    return _call(get_family(family).name, args, kwargs, stream, pdl)


def tune_kernel(kernel_name, kernel_source, problem_size, arguments, tune_params, *args, **kwargs):
    """Tune one CUDA kernel with Kernel Tuner's arguments; returns (results, env) with .best
    (autogen.search.kernel_tune.tune_kernel; docs/tune_kernel.md)."""
    from autogen.search.kernel_tune import tune_kernel as _tune_kernel
    return _tune_kernel(kernel_name, kernel_source, problem_size, arguments, tune_params, *args, **kwargs)


def __getattr__(name: str):
    # autogen.sgemv and the other per-family calls come from the registry, so that adding a
    # family edits no core module. The function is cached here after the first access.
    family = family_for_api(name) if not name.startswith("_") else None
    if family is None:
        raise AttributeError(f"module 'autogen' has no attribute {name!r}")
    function = _call_function(family.name, family.api, type(family).bind.__doc__)
    globals()[name] = function
    return function


def _call_function(family_name: str, api: str, doc: str | None):
    # The dispatcher's hot path itself (no wrapper around it): one Python call per kernel call.
    from autogen.runtime.dispatch import make_call

    call_family = make_call(family_name)
    call_family.__name__ = call_family.__qualname__ = api
    call_family.__doc__ = doc
    return call_family


from autogen.core.registry import family_for_api  # noqa: E402

__all__ = ["Family", "Launch", "Param", "Peer", "Space", "Step", "Trait", "all_families", "call", "get_family",
           "kernel_family", "lookup", "register", "tune_kernel", "__version__"]
