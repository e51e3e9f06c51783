"""Kernel launches with launch attributes, through the driver's cuLaunchKernelEx (ctypes).

CuPy's RawKernel (cupy.cuda.function.Function) launches with cuLaunchKernel and sets no launch
attributes, and cuda-python is not a dependency of autogen. Programmatic dependent launch (PDL)
needs CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION on the dependent kernel's launch, so
this module calls cuLaunchKernelEx on libcuda directly, with the CUlaunchConfig and
CUlaunchAttribute structs laid out as CUDA 12/13's cuda.h declares them (tests/test_launch.py
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
import struct
import sys
import threading

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
    value = getattr(value, "held", value)  # autogen.family.kernel_scalar's holders
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


# struct codes of the scalar kernel arguments, each in an 8-byte slot of the packed block.
_STRUCT_CODES = {np.dtype(np.int32): "i", np.dtype(np.uint32): "I", np.dtype(np.int64): "q",
                 np.dtype(np.uint64): "Q", np.dtype(np.float32): "f", np.dtype(np.float64): "d",
                 np.dtype(np.int16): "h", np.dtype(np.uint16): "H", np.dtype(np.int8): "b",
                 np.dtype(np.uint8): "B", np.dtype(np.bool_): "?"}


class PackedLaunch:
    """One kernel of a served variant, launched through the driver's cuLaunchKernel (CuPy's own
    binding of it) with its argument block packed in place.

    CuPy's Function.__call__ wraps every argument in a new CPointer object on every launch, which
    costs more host time than the rest of a dispatched call. Here the argument kinds are read once,
    from the first call's arguments: a device array passes its pointer, a scalar (a NumPy scalar,
    or autogen.family.kernel_scalar's holder) its C type. Each later call packs the values into a
    fixed buffer with one struct.pack_into; the driver copies them at the launch. A call whose
    arguments do not fit the kinds read first (another type in a slot) goes through CuPy's call.
    The buffer is shared, hence the lock: the driver reads it with the GIL released."""

    def __init__(self, function, grid, block, shared_bytes: int = 0):
        self.function = function
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.block = tuple(block) + (1,) * (3 - len(block))
        self.shared_bytes = int(shared_bytes)
        self._pack = None  # built by the first call
        self._lock = threading.Lock()

    def __call__(self, args: tuple, stream=None) -> None:
        pack = self._pack or self._prepare(args)
        if pack is False:
            self.function(self.grid, self.block, args, self.shared_bytes, stream)
            return
        pointer = stream.ptr if stream is not None else _current_stream_ptr()
        with self._lock:
            try:
                pack(args)
            except (AttributeError, TypeError, struct.error, IndexError):
                self.function(self.grid, self.block, args, self.shared_bytes, stream)
                return
            _launch_kernel(self._function_ptr, *self.grid, *self.block, self.shared_bytes, pointer,
                           self._params, 0)

    def _prepare(self, args: tuple):
        """The packing function for arguments like `args`; False where one has no known C kind
        (those launches stay with CuPy)."""
        fields, codes = [], []
        for index, value in enumerate(args):
            held = getattr(value, "held", None)  # kernel_scalar's holder: its NumPy scalar
            if held is not None:
                value, access = held, f"args[{index}].held"
            else:
                access = f"args[{index}]"
            data = getattr(value, "data", None)
            if data is not None and hasattr(data, "ptr"):
                codes.append("Q")
                fields.append(f"{access}.data.ptr")
            elif isinstance(value, np.generic) and value.dtype in _STRUCT_CODES:
                code = _STRUCT_CODES[value.dtype]
                codes.append(code + f"{8 - struct.calcsize(code)}x")
                fields.append(access)
            else:
                self._pack = False
                return False
        layout = struct.Struct("<" + "".join(codes))
        self._buffer = ctypes.create_string_buffer(max(8, layout.size))
        base = ctypes.addressof(self._buffer)
        self._slots = (ctypes.c_void_p * max(1, len(codes)))(*[base + 8 * i for i in range(len(codes))])
        self._params = ctypes.addressof(self._slots)
        self._function_ptr = self.function.ptr
        # One generated expression per variant, the fastest Python can pack (namedtuple builds its
        # classes the same way): e.g. pack_into(buffer, 0, args[0].data.ptr, args[2].held).
        source = f"lambda args: pack_into(buffer, 0, {', '.join(fields)})"
        self._pack = eval(source, {"pack_into": layout.pack_into, "buffer": self._buffer})
        return self._pack


def _bind_cupy() -> None:
    """Bind the hot path to CuPy's driver binding and current-stream query, once."""
    global _launch_kernel, _current_stream_ptr
    import cupy
    from cupy.cuda import driver

    _launch_kernel = driver.launchKernel
    _current_stream_ptr = getattr(cupy.cuda.stream, "get_current_stream_ptr", None) or (
        lambda: cupy.cuda.get_current_stream().ptr)


def _launch_kernel(*arguments) -> None:
    _bind_cupy()
    _launch_kernel(*arguments)


def _current_stream_ptr() -> int:
    _bind_cupy()
    return _current_stream_ptr()


def launch_config(grid, block, shared_bytes: int, stream_ptr: int, pdl: bool):
    """(CUlaunchConfig, attribute array) for one launch; the array must outlive the call."""
    attrs = (CUlaunchAttribute * 1)()
    attrs[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attrs[0].value.programmaticStreamSerializationAllowed = 1
    grid = tuple(grid) + (1,) * (3 - len(grid))
    block = tuple(block) + (1,) * (3 - len(block))
    config = CUlaunchConfig(*(max(1, int(g)) for g in grid), *(max(1, int(b)) for b in block),
                            int(shared_bytes), ctypes.c_void_p(stream_ptr or None),
                            ctypes.cast(attrs, ctypes.POINTER(CUlaunchAttribute)), 1 if pdl else 0)
    return config, attrs


def launch_ex(function_ptr: int, grid, block, args, shared_bytes: int = 0, stream_ptr: int = 0,
              pdl: bool = True, lib=None) -> None:
    """Launch a CUfunction (a CuPy Function's `.ptr`) on `stream_ptr` with cuLaunchKernelEx;
    with `pdl`, allowing programmatic stream serialization (the kernel may overlap the tail of
    the previous kernel on the stream and must `griddepcontrol.wait` before reading its output)."""
    lib = lib or libcuda()
    values = [c_argument(a) for a in args]
    params = (ctypes.c_void_p * max(1, len(values)))(
        *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
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


__all__ = ["CUlaunchAttribute", "CUlaunchAttributeValue", "CUlaunchConfig", "LaunchError", "PackedLaunch", "c_argument",
           "ensure_context", "launch_config", "launch_ex", "libcuda"]
