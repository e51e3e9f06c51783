"""Helpers a family's Python call (Family.bind) uses to check and arrange its operands: device
arrays from CuPy or PyTorch, new outputs, the stream of the dispatched call and CUDA-graph
capture, kernel scalars kept alive, scratch workspaces, random inputs."""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any

import numpy as np

from autogen.core.dtypes import DTYPES, to_storage
from autogen.errors import ArgumentError, CaptureError

# --- operand helpers for bind() -------------------------------------------------------------

def device_array(cupy, obj, name: str, dtypes: tuple[str, ...], ndim: int, device: int):
    """A CuPy view of a caller's CUDA array (CuPy, PyTorch, __cuda_array_interface__ or DLPack),
    checked for dtype (names of autogen.core.dtypes; bfloat16 arrives as its uint16 bit patterns),
    rank, layout and device (the current one); errors name the argument."""
    if type(obj) is cupy.ndarray:
        allowed = _DTYPE_OBJECTS.get(dtypes)
        # The hot path of a dispatched call: every check passes, tested in one expression.
        if (allowed is not None and obj.ndim == ndim and obj.dtype in allowed and obj._c_contiguous
                and obj.data.device_id == device):
            return obj
        array = obj
    elif hasattr(obj, "__cuda_array_interface__"):
        # torch describes bfloat16 as raw 2-byte items ("<V2"): hand over its bit patterns.
        array = cupy.asarray(_bits_if_bfloat16(obj))
    elif hasattr(obj, "__dlpack__") and _on_cuda(obj):
        array = cupy.from_dlpack(_bits_if_bfloat16(obj))
    else:
        raise ArgumentError(f"{name} must be a CUDA array (CuPy, PyTorch, or anything with "
                            f"__cuda_array_interface__ or DLPack), got {type(obj).__name__}")
    if array.ndim != ndim:
        raise ArgumentError(f"{name} must be {ndim}-dimensional, got shape {array.shape}")
    if array.dtype not in _dtype_objects(dtypes):  # dtype.name is slow: compare dtype objects
        raise ArgumentError(f"{name} must have dtype {' or '.join(dtypes)}, got {dtype_name(array)}")
    if not array._c_contiguous:  # CuPy's own flag; .flags builds an object on every call
        raise ArgumentError(f"{name} must be C-contiguous (row-major, no strides)")
    if array.data.device_id != device:
        raise ArgumentError(f"{name} is on GPU {array.data.device_id}, but the current device is GPU {device}")
    return array


def dtype_name(array) -> str:
    """The autogen dtype name of an array as stored (uint16 is bfloat16's bit patterns)."""
    dtype = array.dtype
    name = _NAME_OF_STORAGE.get(dtype)  # not .get(dtype, dtype.name): .name is slow to build
    return name if name is not None else dtype.name


_NAME_OF_STORAGE = {np.dtype(d.storage): d.name for d in reversed(list(DTYPES.values()))
                    if d.storage != "uint16" or d.name == "bfloat16"}


_DTYPE_OBJECTS: dict[tuple[str, ...], tuple] = {}  # dtype names -> their storage dtype objects


def _dtype_objects(dtypes: tuple[str, ...]) -> tuple:
    found = _DTYPE_OBJECTS.get(dtypes)
    if found is None:
        found = _DTYPE_OBJECTS[dtypes] = tuple(np.dtype(DTYPES[d].storage) for d in dtypes)
    return found


def _bits_if_bfloat16(obj):
    # CuPy has no bfloat16: a torch bfloat16 tensor is handed over as its uint16 bit patterns.
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.dtype == torch.bfloat16:
        return obj.view(torch.uint16)
    return obj


def _on_cuda(obj) -> bool:
    # DLPack device types: 2 = CUDA, 13 = CUDA managed. A host array (NumPy) is refused.
    try:
        return obj.__dlpack_device__()[0] in (2, 13)
    except Exception:
        return False


def new_output(cupy, like, shape: tuple[int, ...], dtype: str, argument: str = "out"):
    """An output of the caller's kind: a torch tensor when the operand is one (inside
    torch.cuda.graph it comes from the graph's pool), else CuPy (a bfloat16 CuPy output holds bit
    patterns, dtype uint16). Inside CuPy stream capture CuPy's pool cannot allocate for the graph:
    CaptureError asks for `argument` to be passed in."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.empty(shape, dtype=getattr(torch, DTYPES[dtype].torch_name), device=like.device)
    if stream_capturing(cupy):
        raise CaptureError(f"inside CUDA graph capture, pass {argument}= (allocated before the capture): "
                           "CuPy's memory pool cannot allocate for the graph")
    return cupy.empty(shape, dtype=DTYPES[dtype].storage)


# --- the stream of a dispatched call, CUDA graph capture, kernel scalars ----------------------

_call_state = threading.local()


@contextlib.contextmanager
def call_stream(stream):
    """Within: the stream the dispatched call will launch on (a CuPy stream; None: the
    framework's current one), for binds that keep per-stream workspace (call_stream_ptr)."""
    previous = getattr(_call_state, "stream", None)
    _call_state.stream = stream
    try:
        yield
    finally:
        _call_state.stream = previous


def call_stream_ptr(cupy, like) -> int:
    """The handle of the stream the current dispatched call launches on: the one given with
    stream=, else PyTorch's current stream for a tensor operand, else CuPy's current stream."""
    stream = getattr(_call_state, "stream", None)
    if stream is not None:
        return stream.ptr
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.cuda.current_stream(like.device).cuda_stream
    return cupy.cuda.get_current_stream().ptr


def stream_capturing(cupy, pointer: int | None = None) -> bool:
    """Whether the stream `pointer` (None: the current dispatched call's, see call_stream_ptr
    with a CuPy operand) is capturing a CUDA graph."""
    if pointer is None:
        stream = getattr(_call_state, "stream", None)
        pointer = stream.ptr if stream is not None else cupy.cuda.get_current_stream().ptr
    try:
        return cupy.cuda.runtime.streamIsCapturing(pointer) != 0
    except Exception:  # an invalidated capture raises: that stream is (was) capturing
        return True


_SCALARS: dict = {}
MAX_SCALARS = 4096


def kernel_scalar(value, kind=np.float32):
    """A kernel argument holding `value` as `kind` (np.float32, np.int32...), converted once per
    value: CuPy then passes it without converting it on every launch (a size-one array holder
    that CuPy's launcher accepts as is, where this CuPy has one; else the NumPy scalar).
    autogen.gpu.launch reads the value back from `.held`."""
    key = (kind, value)
    try:
        found = _SCALARS.get(key)
    except TypeError:  # unhashable (an array): converted on every call
        return _held_scalar(kind(value))
    if found is None:
        found = _held_scalar(kind(value))
        if len(_SCALARS) < MAX_SCALARS and value == value:  # NaN never equals its key
            _SCALARS[key] = found
    return found


_HOLDER = None


def _held_scalar(scalar):
    global _HOLDER
    if _HOLDER is None:
        _HOLDER = _holder_class()
    if _HOLDER is False:
        return scalar
    holder = _HOLDER(np.array(scalar))
    holder.held = scalar
    return holder


def _holder_class():
    """A Python subclass of CuPy's CNumpyArray (a CPointer: its launcher passes CPointers as
    they are), or False where this CuPy has none or it cannot be subclassed."""
    import os
    if os.environ.get("AUTOGEN_PLAIN_SCALARS"):  # kill switch: NumPy scalars, converted per launch
        return False
    cupy = sys.modules.get("cupy")
    base = getattr(getattr(getattr(cupy, "cuda", None), "function", None), "CNumpyArray", None)
    if base is None:
        return False
    try:
        holder = type("HeldScalar", (base,), {})
        probe = holder(np.array(np.float32(1.0)))
        probe.held = np.float32(1.0)
    except Exception:
        return False
    return holder


def random_uniform(xp, rng, shape, dtype) -> Any:
    """Uniform in [-0.5, 0.5): never zeros, so unwritten outputs and bad indexing show. `dtype`
    is an autogen dtype name ("bfloat16" gives bit patterns) or a NumPy/CuPy dtype."""
    values = rng.random(shape, dtype=xp.float32)
    values -= xp.float32(0.5)  # in place: no second array
    if isinstance(dtype, str) and dtype in DTYPES:
        return to_storage(xp, values, dtype)
    return values.astype(dtype, copy=False)


_WORKSPACES: dict[tuple, tuple] = {}  # (device, stream, owner) -> its arrays
_FITTING: dict[tuple, tuple] = {}  # (device, stream, owner, sizes) -> the arrays, known large enough


def stream_workspace(cupy, device: int, like, owner: str, sizes: tuple[tuple[int, str], ...]) -> tuple:
    """Scratch arrays of a dispatched call ((count, dtype) each, zeroed once), kept per device,
    stream and owner, so that a call allocates nothing once warmed up (a CUDA graph can capture
    it) and concurrent calls on different streams never share them. Inside torch.cuda.graph they
    come from the graph's pool; inside CuPy's capture without a warm-up, a CaptureError says so."""
    stream = call_stream_ptr(cupy, like)
    fitting = _FITTING.get((device, stream, owner, sizes))  # the hot path: one lookup
    if fitting is not None:
        return fitting
    found = _WORKSPACES.get((device, stream, owner))
    if found is not None and all(a.size >= count for a, (count, _) in zip(found, sizes)):
        _FITTING[(device, stream, owner, sizes)] = found
        return found
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor) and torch.cuda.is_current_stream_capturing():
        return tuple(cupy.asarray(torch.zeros(max(count, 1), dtype=getattr(torch, dtype), device=like.device))
                     for count, dtype in sizes)
    if stream_capturing(cupy, stream):
        raise CaptureError(f"{owner} keeps its workspace per stream and has none for the capturing stream: "
                           "warm up: call it once on that stream outside the graph, then capture")
    arrays = tuple(cupy.zeros(max(count, 1), dtype=dtype) for count, dtype in sizes)
    cupy.cuda.get_current_stream().synchronize()  # zeroed before any stream uses them (once)
    _WORKSPACES[(device, stream, owner)] = arrays
    for key in [k for k in _FITTING if k[:3] == (device, stream, owner)]:
        del _FITTING[key]  # they name the arrays just replaced
    _FITTING[(device, stream, owner, sizes)] = arrays
    return arrays
