"""Kernel launches with launch attributes, through the driver's cuLaunchKernelEx (ctypes).

CuPy's RawKernel (cupy.cuda.function.Function) launches with cuLaunchKernel and sets no launch
attributes, and cuda-python is not a dependency of autogen. Programmatic dependent launch (PDL)
needs CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION on the dependent kernel's launch, so
this module calls cuLaunchKernelEx on libcuda directly, with the CUlaunchConfig and
CUlaunchAttribute structs laid out as CUDA 12/13's cuda.h declares them (tests/gpu/test_launch.py
checks sizes and offsets against the header with a C compiler where one is present).

With the attribute set, the kernel may start while the previous kernel on the stream is still
running; it must execute `griddepcontrol.wait` before touching that kernel's output (the sgemv
template's `pdl` variable places it after the weight loads). The attribute survives stream
capture: the captured kernel node gets a programmatic dependency edge.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

import numpy as np

CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class CUlaunchAttributeValue(ctypes.Union):
    # `char pad[64]` in cuda.h; its largest member (CUaccessPolicyWindow) holds a pointer, so
    # the union is 8-byte aligned: _align stands for that.
    _fields_ = [("pad", ctypes.c_char * 64),
                ("programmaticStreamSerializationAllowed", ctypes.c_int),
                ("_align", ctypes.c_void_p)]


class CUlaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int),  # CUlaunchAttributeID (an enum: 4 bytes)
                ("pad", ctypes.c_char * 4),  # char pad[8 - sizeof(CUlaunchAttributeID)]
                ("value", CUlaunchAttributeValue)]


class CUlaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint),
                ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(CUlaunchAttribute)),
                ("numAttrs", ctypes.c_uint)]


class LaunchError(RuntimeError):
    """The driver refused a launch (the message holds its error name and text)."""


@functools.lru_cache(maxsize=1)
def libcuda():
    """The driver library, with cuLaunchKernelEx's prototype set."""
    names = ["libcuda.so.1", "libcuda.so"] if sys.platform != "win32" else ["nvcuda.dll"]
    found = ctypes.util.find_library("cuda")
    if found:
        names.append(found)
    last = None
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as exc:
            last = exc
    else:
        raise LaunchError(f"the CUDA driver library cannot be loaded: {last}")
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(CUlaunchConfig), ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
    lib.cuGetErrorName.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuGetErrorString.restype = ctypes.c_int
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuCtxGetCurrent.restype = ctypes.c_int
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    return lib


def _error_text(lib, code: int) -> str:
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    lib.cuGetErrorName(code, ctypes.byref(name))
    lib.cuGetErrorString(code, ctypes.byref(text))
    decode = lambda v: v.value.decode() if v.value else "?"  # noqa: E731
    return f"{decode(name)} ({code}): {decode(text)}"


# Kernel argument -> ctypes value. Device arrays pass their pointer; scalars their C type.
_NUMPY_TO_CTYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
                    np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
                    np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
                    np.dtype(np.int16): ctypes.c_int16, np.dtype(np.uint16): ctypes.c_uint16,
                    np.dtype(np.int8): ctypes.c_int8, np.dtype(np.uint8): ctypes.c_uint8}


def c_argument(value):
    """A ctypes object holding one kernel argument: a pointer for anything with `.data.ptr`
    (CuPy arrays) or `__cuda_array_interface__`, a C scalar for NumPy scalars and 0-d arrays."""
    value = getattr(value, "held", value)  # autogen.core.operands.kernel_scalar's holders
    data = getattr(value, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return ctypes.c_void_p(data.ptr)
    if hasattr(value, "__cuda_array_interface__"):
        return ctypes.c_void_p(value.__cuda_array_interface__["data"][0])
    if isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0:
        kind = _NUMPY_TO_CTYPES.get(np.asarray(value).dtype)
        if kind is None:
            raise TypeError(f"no C type for a kernel argument of dtype {np.asarray(value).dtype}")
        return kind(value.item() if hasattr(value, "item") else value)
    raise TypeError(f"kernel arguments must be device arrays or NumPy scalars (np.int32(...), "
                    f"np.float32(...)), got {type(value).__name__}: Python ints and floats have no C width")


def dims3(dims) -> tuple[int, int, int]:
    """A grid or block as the driver takes it: three sizes, missing ones 1, none below 1."""
    dims = tuple(dims) + (1,) * (3 - len(dims))
    return tuple(max(1, int(d)) for d in dims)


def parameter_block(args) -> tuple[list, ctypes.Array]:
    """(each argument as a ctypes value, the void*[] pointing at them): cuLaunchKernel's kernel
    parameters. Both must outlive the launch (or every launch, where the block is kept)."""
    values = [c_argument(a) for a in args]
    return values, (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])


def launch_config(grid, block, shared_bytes: int, stream_ptr: int, pdl: bool):
    """(CUlaunchConfig, attribute array) for one launch; the array must outlive the call."""
    attrs = (CUlaunchAttribute * 1)()
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attrs[0].value.programmaticStreamSerializationAllowed = 1
    config = CUlaunchConfig(*dims3(grid), *dims3(block), int(shared_bytes), ctypes.c_void_p(stream_ptr or None),
                            ctypes.cast(attrs, ctypes.POINTER(CUlaunchAttribute)), 1 if pdl else 0)
    return config, attrs


def launch_ex(function_ptr: int, grid, block, args, shared_bytes: int = 0, stream_ptr: int = 0,
              pdl: bool = True, lib=None) -> None:
    """Launch a CUfunction (a CuPy Function's `.ptr`) on `stream_ptr` with cuLaunchKernelEx;
    with `pdl`, allowing programmatic stream serialization (the kernel may overlap the tail of
    the previous kernel on the stream and must `griddepcontrol.wait` before reading its output)."""
    lib = lib or libcuda()
    _values, params = parameter_block(args)
    config, _attrs = launch_config(grid, block, shared_bytes, stream_ptr, pdl)
    code = lib.cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(function_ptr), params, None)
    if code != 0:
        raise LaunchError(f"cuLaunchKernelEx failed: {_error_text(lib, code)}")


def ensure_context(cupy) -> None:
    """Make the current device's primary context current on this thread: driver calls made
    through ctypes see no context where only CuPy's runtime calls were made on another thread."""
    lib = libcuda()
    current = ctypes.c_void_p()
    if lib.cuCtxGetCurrent(ctypes.byref(current)) != 0 or not current.value:
        cupy.cuda.Device().use()  # cudaSetDevice makes the primary context current (CUDA >= 12)


__all__ = ["CUlaunchAttribute", "CUlaunchAttributeValue", "CUlaunchConfig", "LaunchError", "c_argument", "dims3",
           "ensure_context", "launch_config", "launch_ex", "libcuda", "parameter_block"]
