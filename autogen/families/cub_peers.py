"""CUB peers of histogram, copy_if and scan from the benchmark's nvcc build (scripts/cub_peers.cu).

CuPy reaches no CUB select and only HistogramRange (over float bin edges) for histograms, and its
cumsum goes through CUB only where CUPY_ACCELERATORS names it (and never int32 into int64), so the
benchmark builds CUB's DeviceHistogram::HistogramEven, DeviceSelect::If and DeviceScan into a shared library
and names it in AUTOGEN_CUB_PEERS; these peers then run it through ctypes on CuPy's current
stream with preallocated temporary storage: no allocation, no synchronisation, safe inside
stream capture (so timed by the same CUDA-graph method as autogen's kernels). Without the
variable, or with a library that does not load, there is no CUB peer (None).
"""

from __future__ import annotations

import ctypes
import functools
import os

from autogen.core.family import Peer

ENV = "AUTOGEN_CUB_PEERS"


class CubPeers:
    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        size_p = ctypes.POINTER(ctypes.c_size_t)
        p = ctypes.c_void_p
        self.lib.autogen_cub_histogram_even_i32.argtypes = [p, size_p, p, p, ctypes.c_int, ctypes.c_int, p]
        self.lib.autogen_cub_select_gt_i32.argtypes = [p, size_p, p, p, p, ctypes.c_int, ctypes.c_int, p]
        self.lib.autogen_cub_select_gt_f32.argtypes = [p, size_p, p, p, p, ctypes.c_int, ctypes.c_float, p]
        for name in self.SCANS.values():
            getattr(self.lib, name).argtypes = [p, size_p, p, p, ctypes.c_int, ctypes.c_int, p]
        for name in ("autogen_cub_histogram_even_i32", "autogen_cub_select_gt_i32", "autogen_cub_select_gt_f32",
                     *self.SCANS.values()):
            getattr(self.lib, name).restype = ctypes.c_int

    # (x dtype, out dtype) -> the DeviceScan entry point of scripts/cub_peers.cu
    SCANS = {("float32", "float32"): "autogen_cub_scan_f32", ("int32", "int32"): "autogen_cub_scan_i32",
             ("int32", "int64"): "autogen_cub_scan_i32_i64"}

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"CUB {what} failed with cudaError_t {status}")

    def _temp(self, cupy, query) -> tuple[object, ctypes.c_size_t]:
        """Temporary storage of the size CUB asks for (at least one byte), kept by the peer."""
        size = ctypes.c_size_t(0)
        self._check(query(ctypes.byref(size)), "size query")
        return cupy.empty(max(1, size.value), dtype=cupy.uint8), size

    def histogram_peer(self, cupy, n: int, bins: int) -> Peer:
        fn = self.lib.autogen_cub_histogram_even_i32
        temp, size = self._temp(cupy, lambda s: fn(None, s, None, None, n, bins, None))

        def run(inputs: dict) -> None:
            stream = cupy.cuda.get_current_stream().ptr
            self._check(fn(temp.data.ptr, ctypes.byref(size), inputs["x"].data.ptr, inputs["counts"].data.ptr,
                           n, bins, stream), "HistogramEven")

        return Peer("CUB DeviceHistogram::HistogramEven", run)

    def select_peer(self, cupy, dtype: str, n: int) -> Peer:
        fn = self.lib.autogen_cub_select_gt_i32 if dtype == "int32" else self.lib.autogen_cub_select_gt_f32
        scalar = int if dtype == "int32" else float
        temp, size = self._temp(cupy, lambda s: fn(None, s, None, None, None, n, 0, None))

        def run(inputs: dict) -> None:
            stream = cupy.cuda.get_current_stream().ptr
            self._check(fn(temp.data.ptr, ctypes.byref(size), inputs["x"].data.ptr, inputs["values"].data.ptr,
                           inputs["count"].data.ptr, n, scalar(inputs["threshold"]), stream), "DeviceSelect::If")

        return Peer("CUB DeviceSelect::If", run)


    def scan_peer(self, cupy, dtype: str, out_dtype: str, n: int, exclusive: bool) -> Peer:
        fn = getattr(self.lib, self.SCANS[(dtype, out_dtype)])
        flag = int(exclusive)
        temp, size = self._temp(cupy, lambda s: fn(None, s, None, None, n, flag, None))

        def run(inputs: dict) -> None:
            stream = cupy.cuda.get_current_stream().ptr
            self._check(fn(temp.data.ptr, ctypes.byref(size), inputs["x"].data.ptr, inputs["out"].data.ptr,
                           n, flag, stream), "DeviceScan")

        return Peer(f"CUB DeviceScan::{'Exclusive' if exclusive else 'Inclusive'}Sum", run)


@functools.lru_cache(maxsize=1)
def cub_library() -> CubPeers | None:
    path = os.environ.get(ENV)
    if not path or not os.path.isfile(path):
        return None
    try:
        return CubPeers(path)
    except (OSError, AttributeError):
        return None
