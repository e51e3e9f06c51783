"""Library peers (cuBLAS, CUB through CuPy, PyTorch) callable inside CUDA stream capture, so they
are timed by the same CUDA-graph method as autogen's kernels, in the same run.

cuBLAS: CuPy refuses any cuBLAS call while a stream is capturing ("calling cuBLAS API during stream
capture is currently unsupported"), although cuBLAS itself supports capture. So peers call the
same library CuPy loaded, through ctypes, on a handle of their own bound to the current stream;
scalars are host pointers, read at capture time and baked into the graph.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Callable

from autogen.core.dtypes import DTYPES
from autogen.core.family import Peer
from autogen.errors import GpuUnavailableError

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_DEFAULT_MATH = 0


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    from cuda.pathfinder import load_nvidia_dynamic_lib

    lib = ctypes.CDLL(load_nvidia_dynamic_lib("cublas").abs_path)
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cublasSgemv_v2.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.cublasSgemm_v2.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                   ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.cublasSgemmStridedBatched.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_int]
    lib.cublasSetMathMode.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


class CublasHandle:
    """One cuBLAS handle; every call is issued on the stream passed to it."""

    def __init__(self):
        self._lib = _library()
        self._handle = ctypes.c_void_p()
        _check(self._lib.cublasCreate_v2(ctypes.byref(self._handle)), "cublasCreate")
        # CUBLAS_DEFAULT_MATH: true fp32 (no TF32 tensor-op math), the peer of an fp32 SIMT kernel.
        _check(self._lib.cublasSetMathMode(self._handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode")

    def _on(self, stream_ptr: int) -> None:
        _check(self._lib.cublasSetStream_v2(self._handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream")

    def sgemv_row_major(self, stream_ptr: int, m: int, n: int, alpha: float, A_ptr: int, x_ptr: int,
                        beta: float, y_ptr: int) -> None:
        """y = alpha * A x + beta * y for row-major A (m x n): column-major A^T, transposed."""
        self._on(stream_ptr)
        alpha_c, beta_c = ctypes.c_float(alpha), ctypes.c_float(beta)
        _check(self._lib.cublasSgemv_v2(self._handle, CUBLAS_OP_T, n, m, ctypes.byref(alpha_c), A_ptr, n,
                                        x_ptr, 1, ctypes.byref(beta_c), y_ptr, 1), "cublasSgemv")

    def sgemm_row_major(self, stream_ptr: int, m: int, n: int, k: int, alpha: float, A_ptr: int, B_ptr: int,
                        beta: float, C_ptr: int) -> None:
        """C = alpha * A B + beta * C for row-major A (m x k), B (k x n), C (m x n): in column-major
        terms C^T = B^T A^T, so cuBLAS multiplies B (n x k, ld n) by A (k x m, ld k)."""
        self._on(stream_ptr)
        alpha_c, beta_c = ctypes.c_float(alpha), ctypes.c_float(beta)
        _check(self._lib.cublasSgemm_v2(self._handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, ctypes.byref(alpha_c),
                                        B_ptr, n, A_ptr, k, ctypes.byref(beta_c), C_ptr, n), "cublasSgemm")

    def sgemm_strided_batched_row_major(self, stream_ptr: int, batch: int, m: int, n: int, k: int, A_ptr: int,
                                        B_ptr: int, C_ptr: int) -> None:
        """C[b] = A[b] B[b] for `batch` contiguous row-major A (m x k), B (k x n), C (m x n), as
        sgemm_row_major (torch.bmm's cuBLAS call, TF32 off)."""
        self._on(stream_ptr)
        alpha_c, beta_c = ctypes.c_float(1.0), ctypes.c_float(0.0)
        _check(self._lib.cublasSgemmStridedBatched(
            self._handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, ctypes.byref(alpha_c), B_ptr, n, k * n, A_ptr, k, m * k,
            ctypes.byref(beta_c), C_ptr, n, m * n, batch), "cublasSgemmStridedBatched")


def cublas_handle() -> CublasHandle | None:
    """A handle of the cuBLAS library CuPy uses, or None where there is none."""
    try:
        return CublasHandle()
    except Exception:  # no cuBLAS library on this machine
        return None


# -- CuPy (CUB) calls -----------------------------------------------------------------------------


class ReplayArena:
    """A CuPy allocator for a library call timed inside stream capture: every call gets the same
    addresses, in the same order, from one buffer kept alive as long as the arena.

    CuPy allocates temporary storage (CUB's) and results from its memory pool on every call;
    inside stream capture a pool allocation is unsafe (the captured graph keeps an address the
    pool hands to someone else after capture). A warm-up call outside capture (which also
    compiles CuPy's kernels) records the sizes; later calls are served from one buffer, which is
    safe because calls are ordered on one stream."""

    ALIGN = 256

    def __init__(self, cupy, call):
        self._cupy = cupy
        requests: list[int] = []
        pool_malloc = cupy.get_default_memory_pool().malloc

        def recording(size: int):
            requests.append(size)
            return pool_malloc(size)

        with cupy.cuda.using_allocator(recording):
            call()
        cupy.cuda.get_current_stream().synchronize()
        self.capacity = max(self.ALIGN, sum(_round_up(size, self.ALIGN) for size in requests))
        self._buffer = cupy.cuda.alloc(self.capacity)
        self._offset = 0

    def malloc(self, size: int):
        start = self._offset
        self._offset += _round_up(size, self.ALIGN)
        if self._offset > self.capacity:
            raise MemoryError(f"the call asked for more than the {self.capacity} bytes its warm-up needed")
        return self._buffer + start

    def run(self, call) -> None:
        self._offset = 0
        with self._cupy.cuda.using_allocator(self.malloc):
            call()


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# -- PyTorch --------------------------------------------------------------------------------------


def torch_cuda():
    """The torch module when PyTorch with CUDA is installed, else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def as_tensor(torch, array, dtype: str):
    """A zero-copy torch view of a CuPy array stored as autogen dtype `dtype` (bfloat16 bit
    patterns become a bfloat16 tensor)."""
    tensor = torch.as_tensor(array, device="cuda")
    if DTYPES[dtype].storage != DTYPES[dtype].name:  # stored as bit patterns
        tensor = tensor.view(getattr(torch, DTYPES[dtype].torch_name))
    return tensor


def torch_stream_peer(name: str, dtypes: dict[str, str], call: Callable[[dict], None]) -> Peer | None:
    """A peer that runs `call(tensors)` on CuPy's current stream (so it is captured with the
    timing graph). `dtypes` names the inputs-dict arrays to hand over, with their autogen dtype;
    each input set is wrapped once (zero-copy, no stream work) and reused. `call` must not
    allocate (use out= forms) and should have been warmed up by the caller outside capture."""
    torch = torch_cuda()
    if torch is None:
        return None
    try:
        from autogen.gpu.device import require_cupy
        cupy = require_cupy()
    except GpuUnavailableError:
        return None
    wrapped: dict[int, tuple] = {}

    def tensors(inputs: dict) -> dict:
        entry = wrapped.get(id(inputs))
        if entry is None or entry[0] is not inputs:  # the dict is kept, so ids are not reused
            entry = (inputs, {key: as_tensor(torch, inputs[key], dtype) for key, dtype in dtypes.items()})
            wrapped[id(inputs)] = entry
        return entry[1]

    def run(inputs: dict) -> None:
        views = tensors(inputs)
        with torch.cuda.stream(torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)):
            call(views)

    return Peer(name, run)

