"""cuBLAS called directly, for peers timed inside CUDA graphs.

CuPy refuses any cuBLAS call while a stream is capturing ("calling cuBLAS API during stream
capture is currently unsupported"), although cuBLAS itself supports capture. So peers call the
same library CuPy loaded, through ctypes, on a handle of their own bound to the current stream;
scalars are host pointers, read at capture time and baked into the graph.
"""

from __future__ import annotations

import ctypes
import functools

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    from cuda.pathfinder import load_nvidia_dynamic_lib

    lib = ctypes.CDLL(load_nvidia_dynamic_lib("cublas").abs_path)
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cublasSgemv_v2.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                   ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
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

    def sgemv_row_major(self, stream_ptr: int, m: int, n: int, alpha: float, A_ptr: int, x_ptr: int,
                        beta: float, y_ptr: int) -> None:
        """y = alpha * A x + beta * y for row-major A (m x n): column-major A^T, transposed."""
        _check(self._lib.cublasSetStream_v2(self._handle, ctypes.c_void_p(stream_ptr)), "cublasSetStream")
        alpha_c, beta_c = ctypes.c_float(alpha), ctypes.c_float(beta)
        _check(self._lib.cublasSgemv_v2(self._handle, CUBLAS_OP_T, n, m, ctypes.byref(alpha_c), A_ptr, n,
                                        x_ptr, 1, ctypes.byref(beta_c), y_ptr, 1), "cublasSgemv")
