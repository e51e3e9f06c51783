"""The roofline every report states its figures against, measured on the GPU at hand.

Two ceilings, each measured once per GPU and driver and cached (cache_root()/ceilings.json):
  - copy bandwidth: a 16-byte-per-thread device-to-device copy, bytes read plus written;
  - FP32 FMA peak: independent fused multiply-add chains on every SM, 2 flops per FMA.
A memory-bound family's floor is bytes / copy bandwidth; a compute-bound family's is flops / the
FP32 peak (Family.roofline says which). Datasheet figures are never used.
"""

from __future__ import annotations

import json

import numpy as np

from autogen.gpu.compile import compile_cubin
from autogen.gpu.measure import time_enqueue
from autogen.paths import cache_root, write_atomically

COPY_KERNEL = r"""
extern "C" __global__ void autogen_copy_float4(const float4* __restrict__ src, float4* __restrict__ dst,
                                               long long count)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""

# CHAINS independent accumulators per thread hide the FMA latency; the result is stored only if
# impossible, so the compiler keeps every FMA but no memory traffic is timed.
FMA_ITERATIONS = 4096
FMA_CHAINS = 8
FMA_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(256) autogen_fma_peak(float seed, float* sink)
{
    float acc[%(chains)d];
#pragma unroll
    for (int c = 0; c < %(chains)d; ++c) acc[c] = seed + threadIdx.x + c;
    const float a = 1.0000001f, b = -0.9999999f;
    for (int i = 0; i < %(iterations)d; ++i) {
#pragma unroll
        for (int c = 0; c < %(chains)d; ++c) acc[c] = fmaf(acc[c], a, b);
    }
    float total = 0.0f;
#pragma unroll
    for (int c = 0; c < %(chains)d; ++c) total += acc[c];
    if (total == 123456.0f) sink[0] = total;
}
""" % {"chains": FMA_CHAINS, "iterations": FMA_ITERATIONS}


def _cache_file():
    return cache_root() / "ceilings.json"


def _cached() -> dict:
    try:
        return json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _remember(key: str, value: float) -> None:
    try:
        write_atomically(_cache_file(), json.dumps({**_cached(), key: value}, indent=1))
    except OSError:  # an unwritable cache costs a re-measurement next time, nothing else
        pass


def _cached_measure(key: str, measure) -> float:
    cached = _cached()
    if key in cached:
        return cached[key]
    value = measure()
    _remember(key, value)
    return value


def copy_bandwidth_gbs(cupy, device, free_bytes: int, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read plus written)."""
    def measure() -> float:
        count = min(nbytes, free_bytes // 4) // 16  # float4 elements
        src = cupy.ones(4 * count, dtype=cupy.float32)
        dst = cupy.empty_like(src)
        module = cupy.cuda.function.Module()
        module.load(compile_cubin(COPY_KERNEL, device.arch))
        copy = module.get_function("autogen_copy_float4")
        blocks = 4 * device.sm_count * 8
        args = (src, dst, np.int64(count))
        timing = time_enqueue(cupy, lambda _i: copy((blocks,), (256,), args), 1, replays=5)
        return 2 * 16 * count / (timing.median_us * 1e-6) / 1e9

    return _cached_measure(f"copy_gbs|{device.name}|{device.driver_version}", measure)


def fp32_peak_tflops(cupy, device) -> float:
    """FP32 FMA throughput in TFLOP/s, all SMs busy (8 blocks of 256 threads per SM)."""
    def measure() -> float:
        module = cupy.cuda.function.Module()
        module.load(compile_cubin(FMA_KERNEL, device.arch))
        kernel = module.get_function("autogen_fma_peak")
        sink = cupy.zeros(1, dtype=cupy.float32)
        blocks, threads = 8 * device.sm_count, 256
        args = (np.float32(0.5), sink)
        timing = time_enqueue(cupy, lambda _i: kernel((blocks,), (threads,), args), 1, replays=5)
        flops = 2.0 * FMA_ITERATIONS * FMA_CHAINS * blocks * threads
        return flops / (timing.median_us * 1e-6) / 1e12

    return _cached_measure(f"fp32_tflops|{device.name}|{device.driver_version}", measure)


def floor_us(family, problem, bytes_moved: int, copy_gbs: float | None, fp32_tflops: float | None) -> float | None:
    """The roofline time of one call on this GPU, by the family's bound."""
    if family.roofline == "compute":
        flops = family.flops(problem)
        return flops / (fp32_tflops * 1e12) * 1e6 if fp32_tflops and flops else None
    return bytes_moved / (copy_gbs * 1e9) * 1e6 if copy_gbs else None


def cached_ceilings(device) -> tuple[float | None, float | None]:
    """(copy GB/s, FP32 TFLOP/s) as cached for this GPU and driver, without measuring."""
    cached = _cached()
    return (cached.get(f"copy_gbs|{device.name}|{device.driver_version}"),
            cached.get(f"fp32_tflops|{device.name}|{device.driver_version}"))
