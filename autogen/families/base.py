"""What every kernel family provides. One module per family, beside templates/<family>.cu.j2."""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import ArgumentError, UsageError
from ..problem import DTYPE_TAGS, Config, Problem
from ..space import Space

# Each dimension must fit the kernels' 32-bit int arguments.
MAX_DIM = 2**31 - 1


@dataclass(frozen=True)
class Launch:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0  # dynamic shared memory; static shared memory is in the source


@dataclass(frozen=True)
class Step:
    """One kernel launch of a variant. Most variants are one step; a two-kernel reduction is two.
    `symbol` is the extern "C" name: the variant's kernel name plus `suffix`."""

    suffix: str
    launch: Launch
    args: Callable[[dict], tuple]  # kernel arguments, from the inputs dict


@dataclass(frozen=True)
class Peer:
    """The library routine a family is compared with, run on the current stream."""

    name: str
    run: Callable[[dict], Any]  # takes the same inputs dict as the kernel


class Family:
    """Base class. Subclasses set the class attributes and implement the methods that raise."""

    name: str
    template: str  # file name under templates/
    template_source: str | None = None  # inline template text instead (test-only families)
    dims: tuple[str, ...]  # dimension names in order, e.g. ("m", "n")
    dtypes: tuple[str, ...]  # supported dtype names, e.g. ("float32",)
    space: Space
    default_params: Mapping[str, int | str]  # served when nothing is tuned; must be valid
    output: str  # the inputs-dict entry the kernel writes
    # C parameter list shared by every variant's host launcher and the exported entry point
    # (templates rendered with host_launcher=True define `<kernel_name>_launch(c_params, stream)`).
    c_params: str
    c_headers: tuple[str, ...] = ("cuda_runtime.h",)
    tolerance: float = 1e-5  # relative L2 error allowed against the float64 reference
    description: str = ""

    # --- problems -------------------------------------------------------------------------
    def problem(self, dtype: str | None = None, **dims: int) -> Problem:
        """A validated Problem; bad dimensions or dtype raise UsageError naming them."""
        dtype = dtype or self.dtypes[0]
        if dtype not in self.dtypes:
            raise UsageError(f"{self.name} supports dtype {', '.join(self.dtypes)}, not {dtype!r}")
        missing = [d for d in self.dims if d not in dims]
        extra = [d for d in dims if d not in self.dims]
        if missing or extra:
            raise UsageError(
                f"{self.name} needs dimensions {', '.join(self.dims)}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unknown {', '.join(extra)}" if extra else "")
            )
        for d in self.dims:
            value = dims[d]
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise UsageError(f"{self.name}: {d} must be an integer, got {value!r}")
            if not 1 <= value <= MAX_DIM:
                raise UsageError(f"{self.name}: {d} must be between 1 and {MAX_DIM}, got {value}")
        return Problem(self.name, dtype, tuple((d, int(dims[d])) for d in self.dims))

    def tolerance_for(self, problem: Problem) -> float:
        """The relative error a variant may show on this problem (families with several dtypes
        may differ per dtype)."""
        return self.tolerance

    def default_config(self) -> Config:
        return self.space.check(self.default_params)

    def distance(self, a: Problem, b: Problem) -> float:
        """How far apart two shapes are, for the nearest-tuned-shape fallback: log-space L2."""
        return math.sqrt(sum(math.log2(a[d] / b[d]) ** 2 for d in self.dims))

    # --- code -----------------------------------------------------------------------------
    def kernel_name(self, dtype: str, config: Config) -> str:
        """Procedural name, e.g. sgemv_f32_tpr4_vw4_wpb4_rpg1_u2_xldg_rshfl: the extern "C"
        symbol, part of the database key and the exported symbol."""
        parts = [self.name, DTYPE_TAGS[dtype]]
        parts += [f"{self.space.param(k).abbrev}{v}" for k, v in config.params]
        return "_".join(parts)

    def template_vars(self, dtype: str, config: Config, host_launcher: bool = False) -> dict:
        return {"kernel_name": self.kernel_name(dtype, config), "dtype": dtype,
                "host_launcher": host_launcher, "c_params": self.c_params, **config.as_dict()}

    def launch(self, problem: Problem, config: Config) -> Launch:
        raise NotImplementedError

    def plan(self, problem: Problem, config: Config) -> list[Step]:
        """The launches of one call, in order. Default: the one kernel of `launch`."""
        return [Step("", self.launch(problem, config), lambda inputs: self.kernel_args(problem, inputs))]

    def reject_reason(self, problem: Problem, config: Config) -> str | None:
        """Why a valid config is not worth timing on this shape (search pruning), or None."""
        return None

    # --- data -----------------------------------------------------------------------------
    def validation_cases(self, problem: Problem) -> list[dict]:
        """Scalar settings each variant is checked under; each runs on fresh random inputs."""
        return [{}]

    def timing_case(self, problem: Problem) -> dict:
        return self.validation_cases(problem)[0]

    def make_inputs(self, problem: Problem, xp, rng, case: dict) -> dict:
        """Arrays (numpy or cupy, per xp) and scalars for one launch; the output poisoned with
        NaN wherever the kernel must overwrite it."""
        raise NotImplementedError

    def kernel_args(self, problem: Problem, inputs: dict) -> tuple:
        raise NotImplementedError

    def reference(self, problem: Problem, inputs: dict, xp=np):
        """The expected output in float64, computed with xp (numpy, or cupy on the GPU)."""
        raise NotImplementedError

    def reference_magnitude(self, problem: Problem, inputs: dict, xp=np):
        """The denominator of the relative error, or None for the reference itself. Families
        whose outputs are sums of signed terms return the same sums of |terms|: that is the
        scale floating-point rounding is proportional to, so a near-zero output by cancellation
        (likely on tiny shapes) does not fail a correct kernel."""
        return None

    def bytes_moved(self, problem: Problem, case: dict | None = None) -> int:
        """The fewest bytes one launch must move through device memory."""
        raise NotImplementedError

    def flops(self, problem: Problem) -> int:
        return 0

    def peer(self, problem: Problem) -> Peer | None:
        return None

    # --- calls from Python (the dispatcher) -------------------------------------------------
    def bind(self, cupy, device: int, args: tuple, kwargs: dict) -> tuple[Problem, dict, Any]:
        """Check a call's operands (on the current `device`) and turn them into
        (problem, inputs dict, value to return)."""
        raise NotImplementedError(f"{self.name} has no Python call API")


def device_array(cupy, obj, name: str, dtypes: tuple[str, ...], ndim: int, device: int):
    """A CuPy view of a caller's CUDA array (CuPy, PyTorch, __cuda_array_interface__ or DLPack),
    checked for dtype, rank, layout and device (the current one); errors name the argument."""
    if type(obj) is cupy.ndarray:
        array = obj
    elif hasattr(obj, "__cuda_array_interface__"):
        array = cupy.asarray(obj)
    elif hasattr(obj, "__dlpack__") and _on_cuda(obj):
        array = cupy.from_dlpack(obj)
    else:
        raise ArgumentError(f"{name} must be a CUDA array (CuPy, PyTorch, or anything with "
                            f"__cuda_array_interface__ or DLPack), got {type(obj).__name__}")
    if array.ndim != ndim:
        raise ArgumentError(f"{name} must be {ndim}-dimensional, got shape {array.shape}")
    if array.dtype not in _dtype_objects(dtypes):  # dtype.name is slow: compare dtype objects
        raise ArgumentError(f"{name} must have dtype {' or '.join(dtypes)}, got {array.dtype.name}")
    if not array._c_contiguous:  # CuPy's own flag; .flags builds an object on every call
        raise ArgumentError(f"{name} must be C-contiguous (row-major, no strides)")
    if array.data.device_id != device:
        raise ArgumentError(f"{name} is on GPU {array.data.device_id}, but the current device is GPU {device}")
    return array


@functools.lru_cache(maxsize=None)
def _dtype_objects(dtypes: tuple[str, ...]) -> tuple:
    return tuple(np.dtype(d) for d in dtypes)


def _on_cuda(obj) -> bool:
    # DLPack device types: 2 = CUDA, 13 = CUDA managed. A host array (NumPy) is refused.
    try:
        return obj.__dlpack_device__()[0] in (2, 13)
    except Exception:
        return False


def new_output(cupy, like, shape: tuple[int, ...], dtype: str):
    """An output of the caller's kind: a torch tensor when the operand is one, else CuPy."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.empty(shape, dtype=getattr(torch, dtype), device=like.device)
    return cupy.empty(shape, dtype=dtype)


def random_uniform(xp, rng, shape, dtype) -> Any:
    """Uniform in [-0.5, 0.5): never zeros, so unwritten outputs and bad indexing show."""
    return (rng.random(shape, dtype=xp.float32) - xp.float32(0.5)).astype(dtype, copy=False)
