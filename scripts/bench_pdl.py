"""Programmatic dependent launch on a chain of small kernels (as LLM decode launches GEMVs).

One CUDA graph holds 32 pairs (producer kernel writing x_i from y_{i-1}, then GEMV y_i = A_i x_i,
each pair with its own weights A_i, read cold), captured twice:
  off:  plain kernels, plain launches (cuLaunchKernel through CuPy);
  on:   the GEMV's pdl variant (its first weights of A_i requested, griddepcontrol.wait before x_i) and a
        producer that triggers its dependents early and waits before reading y_{i-1}, both
        launched with programmatic stream serialization (autogen.gpu.launch, cuLaunchKernelEx);
  on_no_attr: the pdl kernels with plain launches (what the kernel changes alone cost).
Each graph is replayed R times (CUDA events); the figure is the median time per pair. The final
y of "on" and of "on_no_attr" must be bit-identical to "off" (the same arithmetic in the same
order: only where the loads sit differs). Families: sgemv (fp32) and hgemv (fp16, batch 1).
Usage: python3 scripts/bench_pdl.py --out DIR [--db URL] [--replays 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from benchlib import table, write_results

PAIRS = 32
SHAPES = [(4096, 4096), (16384, 16)]

PRODUCER = r"""
extern "C" __global__ void produce(const float* __restrict__ y_prev, float* __restrict__ x, int n, int m,
                                   int pdl)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (pdl) {
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // the GEMV may start its prologue
        asm volatile("griddepcontrol.wait;" ::: "memory");  // y_prev is the previous GEMV's output
    }
#endif
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 0.5f * tanhf(y_prev[i % m]) + 1e-3f * (float)(i % 7);
}
"""
PRODUCER_HALF = PRODUCER.replace("float* __restrict__ x", "unsigned short* __restrict__ x").replace(
    "const float* __restrict__ y_prev", "const unsigned short* __restrict__ y_prev").replace(
    "x[i] = 0.5f * tanhf(y_prev[i % m]) + 1e-3f * (float)(i % 7);",
    "{ float v; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(v) : \"h\"(y_prev[i % m]));"
    " v = 0.5f * tanhf(v) + 1e-3f * (float)(i % 7); unsigned short h;"
    " asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(v)); x[i] = h; }")


def chain_graph(cupy, family_name, m, n, mode, A, xs, ys, y0, producer, stream):
    """Capture the 32 pairs on `stream`; returns the graph."""
    import numpy as np

    import autogen
    from autogen.gpu.launch import ensure_context, launch_ex

    pdl_kernels = mode in ("on", "on_no_attr")
    kernel = autogen.lookup(family_name, m=m, n=n, pdl=pdl_kernels)
    if mode == "on_no_attr":  # the pdl kernel's functions, launched the plain way
        from autogen.runtime.dispatch import TunedKernel
        kernel = TunedKernel(kernel.problem, kernel.name, kernel.params, kernel.served_by, kernel.provenance,
                             kernel._steps, kernel._module, pdl=False)
    ensure_context(cupy)
    block = 256
    grid = (-(-n // block),)
    with stream:
        stream.begin_capture()
        try:
            previous = y0
            for i in range(PAIRS):
                args = (previous, xs[i], np.int32(n), np.int32(m), np.int32(1 if pdl_kernels else 0))
                if mode == "on":
                    launch_ex(producer.kernel.ptr, grid, (block,), args, 0, stream.ptr, pdl=True)
                else:
                    producer(grid, (block,), args, stream=stream)
                kernel.launch({"A": A[i], "x": xs[i], "y": ys[i], "alpha": 1.0, "beta": 0.0}, stream)
                previous = ys[i]
        finally:
            graph = stream.end_capture()
    return graph, kernel


def time_graph(cupy, graph, stream, replays: int) -> list[float]:
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    graph.launch(stream)
    stream.synchronize()
    samples = []
    for _ in range(replays):
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, stop) * 1000.0)
    return samples


def bench(cupy, family_name: str, dtype, m: int, n: int, replays: int) -> dict:
    rng = cupy.random.default_rng(0)
    A = [(rng.random((m, n), dtype=cupy.float32) - 0.5).astype(dtype) for _ in range(PAIRS)]
    y0 = (rng.random(m, dtype=cupy.float32) - 0.5).astype(dtype)
    code = PRODUCER if dtype == cupy.float32 else PRODUCER_HALF
    producer = cupy.RawModule(code=code, options=("-std=c++17",)).get_function("produce")
    row = {"family": family_name, "shape": f"{m}x{n}", "pairs": PAIRS}
    finals = {}
    for mode in ("off", "on", "on_no_attr"):
        xs = [cupy.empty(n, dtype=dtype) for _ in range(PAIRS)]
        ys = [cupy.empty(m, dtype=dtype) for _ in range(PAIRS)]
        stream = cupy.cuda.Stream(non_blocking=True)
        graph, kernel = chain_graph(cupy, family_name, m, n, mode, A, xs, ys, y0, producer, stream)
        samples = time_graph(cupy, graph, stream, replays)
        finals[mode] = ys[-1].astype(cupy.float64)
        row[f"{mode}_us_per_pair"] = round(statistics.median(samples) / PAIRS, 3)
        row[f"{mode}_spread_us"] = round((max(samples) - min(samples)) / PAIRS, 3)
        row[f"{mode}_kernel"] = kernel.name
    scale = float(cupy.linalg.norm(finals["off"])) or 1.0
    row["on_matches_off"] = float(cupy.linalg.norm(finals["on"] - finals["off"])) / scale < 1e-3
    # Bit-identical (NaN-safe: a NaN anywhere makes them differ).
    row["on_identical_to_off"] = all(bool(cupy.array_equal(finals[mode], finals["off"]))
                                     and not bool(cupy.isnan(finals["off"]).any()) for mode in ("on", "on_no_attr"))
    row["speedup_on_vs_off"] = round(row["off_us_per_pair"] / row["on_us_per_pair"], 3)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--db", help="tuning database (default: $AUTOGEN_DB, then the shipped catalog)")
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import cupy

    import autogen.runtime.dispatch as dispatch
    from autogen.core.registry import all_families

    dispatch._default_dispatcher = dispatch.Dispatcher(args.db)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    families = all_families()
    cases = [("sgemv", cupy.float32)]
    if "hgemv" in families and getattr(families["hgemv"], "pdl_capable", False):
        cases.append(("hgemv", cupy.float16))
    else:
        print("hgemv: not registered or without a pdl variant; skipped", file=sys.stderr)
    rows = [bench(cupy, name, dtype, m, n, args.replays) for name, dtype in cases for m, n in SHAPES]
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    write_results(args.out, "pdl", gpu, {"rows": rows})
    print(f"{gpu}: {PAIRS} (producer, GEMV) pairs in one CUDA graph, us per pair (median of {args.replays} replays)")
    print(table(("family", "shape", "off", "on", "on,no attr", "speedup", "same y", "identical"),
                ((r["family"], r["shape"], r["off_us_per_pair"], r["on_us_per_pair"], r["on_no_attr_us_per_pair"],
                  f"{r['speedup_on_vs_off']}x", r["on_matches_off"], r["on_identical_to_off"]) for r in rows)))
    return 0 if all(r["on_identical_to_off"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
