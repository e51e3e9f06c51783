"""The errors autogen raises on purpose. The CLI turns each into one line and an exit code."""


class AutogenError(Exception):
    """Base class: a failure autogen can explain in one line."""

    exit_code = 1


class UsageError(AutogenError):
    """Bad input from the user: unknown family, impossible shape, malformed option."""

    exit_code = 2


class FamilyError(UsageError):
    """A kernel family's definition is broken (a name, a choice, its template): found when it
    registers, or when its default point is first rendered. Names the family and its module."""


class ArgumentError(UsageError, ValueError):
    """A bad argument to a kernel call: wrong dtype, layout, device or shape. Names the argument."""


class GpuUnavailableError(AutogenError):
    """No CUDA GPU, no driver, or no CuPy: GPU commands cannot run here."""


class InvalidConfigError(AutogenError):
    """A parameter set outside a family's search space (from a user, a database or a file)."""

    exit_code = 2


class CompileError(AutogenError):
    """NVRTC rejected a rendered variant; the message carries the compiler log."""


class ToolMissingError(AutogenError):
    """A CUDA toolkit program a command needs (nvcc for `show --resources`) is not installed."""


class NotTunedError(AutogenError):
    """Nothing stored (or servable) for the request, and the caller asked not to fall back."""


class CaptureError(AutogenError):
    """Work that cannot run inside CUDA graph capture was asked for there (a first call that
    compiles, or an allocation CuPy's pool would make outside the graph): warm up, or pass out=."""


def describe_family(family) -> str:
    """How errors name a family: its name and the module that defines it."""
    return f"family {getattr(family, 'name', '?')!r} ({type(family).__module__})"
