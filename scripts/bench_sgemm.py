"""The sgemm benchmark: tune each shape, the winner vs cuBLAS (TF32 off) in the same run, cold.

Per shape: time, TFLOP/s, the share of the FP32 FMA peak measured here on this GPU (a kernel of
independent FMA chains on every SM, timed in a CUDA graph like everything else), cuBLAS's time
and TFLOP/s from the same tuning run, and the speedup. Per winner: registers, shared memory,
local memory and resident blocks per SM from the loaded cubin, and (where cuobjdump is on PATH)
the SASS instruction mix. Writes DIR/sgemm_<gpu>.json, the winners' sources in DIR/winners/,
and prints a compact table last.

    python scripts/bench_sgemm.py --out DIR --db sqlite:///DIR/tuning.db [--budget-s 420] [--cli-cold-start]

All nine shapes of issue #10 in one run of at most --budget-s seconds (default 420, for an H100):
each shape has its own trial budget and wall-clock limit of its search (PLAN: the limit is
what normally ends it), cut further when the run is late so that every later shape keeps its
minimum. Shapes are tuned in an order where each one's
nearest tuned neighbour is done first (the tuner's warm start tries its winner first): 8192^3
gets a few trials, the first of them the 4096^3 winner. --trials N overrides every shape's
trial budget (the wall-clock limits still hold).

Seeds: the tuner tries the nearest shapes' winners, then Sgemm.seed_configs (the strongest known
configurations fitted to the shape) first.

--cli-cold-start also times `autogen tune sgemm --m 4096 --n 4096 --k 4096` (default budget, 60
trials) as a new user runs it: fresh process, empty kernel cache and database, limited to
--cli-timeout-s (default 240). Expected 45-90 s on an H100 (the first run's 1024^3 search
measured 16 trials in 6 s; a 4096^3 trial is about 0.5-1 s with one graph pass per sample, plus
start-up and the re-timing of the finalists: an estimate, not measured), on top of the
--budget-s of the shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import num, shape_text, table, tune_each, write_results

# Per shape: (m, n, k), trials (variants measured at most), wall-clock limit of its search in
# seconds (what normally ends it), finalists re-timed. In an order where each shape's nearest
# tuned neighbour (the warm start) is tuned before it. The limits add up to 310 s; start-up,
# the variants still in flight when the limit passes, re-timing and the resource report take
# about OVERHEAD_S per shape on top. The tuner stops asking at the limit but measures what it
# has claimed (up to 2 x workers ahead): WORKERS keeps that short.
PLAN = [
    ((4096, 4096, 4096), 30, 70, 5),
    ((8192, 8192, 8192), 6, 45, 3),    # the 4096^3 winner first, then the family's seeds
    ((4097, 4097, 4097), 10, 25, 3),
    ((1024, 1024, 1024), 30, 35, 5),
    ((1000, 1000, 1000), 20, 25, 5),
    ((4096, 4096, 64), 20, 25, 5),
    ((128, 12288, 4096), 24, 30, 5),
    ((12288, 128, 4096), 24, 30, 5),
    ((64, 64, 65536), 24, 25, 5),
]
WORKERS = 4  # NVRTC processes: ahead of the GPU (sgemm variants compile in ~0.3-1 s), 8 claimed at most
SHAPES = [shape for shape, *_ in PLAN]
MIN_SHAPE_S = 10  # what every shape still to come keeps of the budget when the run is late
OVERHEAD_S = 10  # per shape beyond its search limit: start-up, in-flight variants, re-timing, resources
TARGET_SQUARE = 0.90  # of cuBLAS at 4096^3 and 8192^3

FMA_PEAK_KERNEL = r"""
// Independent FMA chains: CHAINS per thread, ITERATIONS deep, so the pipelines never wait.
extern "C" __global__ void __launch_bounds__(256) fma_peak(float* out, float a, float b, int iterations)
{
    constexpr int CHAINS = 8;
    float x[CHAINS];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) x[c] = threadIdx.x * 1e-3f + c;
    for (int i = 0; i < iterations; ++i) {
#pragma unroll
        for (int u = 0; u < 8; ++u)
#pragma unroll
            for (int c = 0; c < CHAINS; ++c) x[c] = fmaf(x[c], a, b);
    }
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) sum += x[c];
    if (sum == 12345.678f) out[0] = sum;  // never true: keeps the chains alive
}
"""


def fp32_peak_tflops() -> dict:
    """FP32 FMA throughput of this GPU, measured: 8 blocks of 256 threads per SM (full
    occupancy on sm_80/sm_90), 8 independent chains per thread, graph-timed like the kernels."""
    import numpy as np

    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.device import device_identity, require_cupy
    from autogen.gpu.measure import time_enqueue

    cupy = require_cupy()
    device = device_identity()
    module = cupy.cuda.function.Module()
    module.load(compile_cubin(FMA_PEAK_KERNEL, device.arch))
    kernel = module.get_function("fma_peak")
    out = cupy.zeros(1, dtype=cupy.float32)
    blocks, threads, iterations = device.sm_count * 8, 256, 2048
    args = (out, np.float32(0.999), np.float32(1e-3), np.int32(iterations))
    timing = time_enqueue(cupy, lambda _i: kernel((blocks,), (threads,), args), 1, replays=7)
    flops = 2 * blocks * threads * iterations * 8 * 8
    return {"tflop_per_s": round(flops / (timing.median_us * 1e-6) / 1e12, 2), "time_us": round(timing.median_us, 2),
            "blocks": blocks, "threads": threads, "gpu": device.name}


# CU_FUNC_ATTRIBUTE_* numbers (cuda.h): a cupy.cuda.function.Function has no num_regs and the
# like on CuPy 14 (only RawKernel has), so they are read from the driver.
FUNC_ATTRIBUTES = {"registers": 4, "shared_bytes": 1, "local_bytes": 3, "max_threads_per_block": 0}


def function_attributes(cupy, function) -> dict:
    """Registers, static shared and local bytes per thread, and the most threads per block of a
    loaded kernel, from cuFuncGetAttribute."""
    return {key: int(cupy.cuda.driver.funcGetAttribute(number, function.ptr))
            for key, number in FUNC_ATTRIBUTES.items()}


def winner_resources(family, problem, params: dict, out: Path) -> dict:
    """Registers, shared and local memory and resident blocks per SM of a winner's main kernel,
    read from its cubin; its source in out/winners; its SASS mix when cuobjdump is on PATH."""
    from autogen.gpu.compile import compile_cubin
    from autogen.families._gemm import geometry
    from autogen.gpu.device import device_identity, require_cupy
    from autogen.core.render import render

    cupy = require_cupy()
    config = family.space.check(params)
    name = family.kernel_name(problem.dtype, config)
    source = render(family, problem.dtype, config)
    folder = out / "winners"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.cu").write_text(source)
    cubin = compile_cubin(source, device_identity().arch)
    (folder / f"{name}.cubin").write_bytes(cubin)
    module = cupy.cuda.function.Module()
    module.load(cubin)
    function = module.get_function(name)
    threads = geometry(config)["threads"]
    info = {**function_attributes(cupy, function), "threads": threads}
    try:
        info["blocks_per_sm"] = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(function.ptr, threads, 0)
    except Exception:
        pass
    if shutil.which("cuobjdump"):
        sass = subprocess.run(["cuobjdump", "-sass", str(folder / f"{name}.cubin")], capture_output=True, text=True).stdout
        (folder / f"{name}.sass").write_text(sass)
        mix = {}
        for line in sass.splitlines():
            parts = line.split("*/")
            if len(parts) < 2:
                continue
            words = parts[1].split()
            if not words:
                continue
            op = words[0] if not words[0].startswith("@") else (words[1] if len(words) > 1 else "")
            op = op.split(".")[0].rstrip(";")
            if op:
                mix[op] = mix.get(op, 0) + 1
        total = sum(mix.values())
        info["sass"] = {"instructions": total, "FFMA": mix.get("FFMA", 0), "LDS": mix.get("LDS", 0),
                        "LDG": mix.get("LDG", 0), "LDGSTS": mix.get("LDGSTS", 0), "STS": mix.get("STS", 0),
                        "BAR": mix.get("BAR", 0), "ffma_share": round(mix.get("FFMA", 0) / total, 3) if total else None}
    return info


def cold_cli_run(out: Path, timeout_s: float) -> dict:
    """`autogen tune sgemm --m 4096 --n 4096 --k 4096` as a new user runs it: default budget,
    fresh process, empty kernel cache and database; killed after timeout_s."""
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, AUTOGEN_CACHE_DIR=f"{scratch}/kernels", AUTOGEN_DB=f"sqlite:///{scratch}/t.db")
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-m", "autogen", "tune", "sgemm", "--m", "4096", "--n", "4096",
                                   "--k", "4096", "--json"], env=env, capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            (out / "cli_tune_4096.stderr.log").write_text(stderr)
            return {"exit_code": None, "wall_s": round(time.monotonic() - started, 2), "timed_out": True,
                    "result": None}
        wall = time.monotonic() - started
        (out / "cli_tune_4096.stderr.log").write_text(done.stderr)
    result = None
    if done.returncode == 0:
        try:
            result = json.loads(done.stdout)
        except ValueError:
            result = {"unparsed_stdout": done.stdout[-2000:]}
    return {"exit_code": done.returncode, "wall_s": round(wall, 2), "timed_out": False,
            "under_2_min": wall < 120, "result": result}


def shape_limit(plan_s: float, deadline: float, later_shapes: int) -> float:
    """This shape's search limit: its plan, cut so that every later shape keeps MIN_SHAPE_S plus
    OVERHEAD_S of what is left before the deadline (at least MIN_SHAPE_S itself)."""
    left = deadline - time.monotonic() - OVERHEAD_S - later_shapes * (MIN_SHAPE_S + OVERHEAD_S)
    return max(MIN_SHAPE_S, min(plan_s, left))


def row_cells(doc: dict) -> tuple:
    w = doc["winner"] or {}
    res = w.get("resources", {})
    return (shape_text(doc), w.get("kernel", doc.get("no_winner", "-")).removeprefix("sgemm_f32_"),
            num(w.get("time_us"), ".2f"), num(w.get("tflop_per_s"), ".2f"), num(w.get("pct_of_fp32_peak"), ".1f"),
            num(w.get("peer_time_us"), ".2f"), num(w.get("peer_tflop_per_s"), ".2f"),
            num(w.get("peer_pct_of_fp32_peak"), ".1f"), num(w.get("speedup_vs_peer"), ".3f"), res.get("registers"),
            res.get("blocks_per_sm"), res.get("local_bytes"), (doc.get("trials") or {}).get("measured"),
            num(doc["wall_s"], ".1f"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trials", type=int, help="variants measured per shape at most (default: PLAN's, 6-30)")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="wall-clock budget of the shapes, start-up to table (default 420)")
    parser.add_argument("--db", help="tuning database (shapes already tuned there are resumed)")
    parser.add_argument("--cli-cold-start", action="store_true",
                        help="also time the default `autogen tune sgemm` at 4096^3 from a cold cache")
    parser.add_argument("--cli-timeout-s", type=float, default=240.0, help="limit of --cli-cold-start (default 240)")
    parser.add_argument("--shapes", help="only these, e.g. 4096x4096x4096,64x64x65536")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from autogen.core.registry import get_family

    report: dict = {}
    if args.cli_cold_start:
        report["cli_cold_start"] = cold_cli_run(args.out, args.cli_timeout_s)
    started = time.monotonic()
    deadline = started + args.budget_s
    peak = fp32_peak_tflops()
    report["fp32_peak"] = peak
    db_url = args.db or f"sqlite:///{args.out / 'bench_tuning.db'}"
    family = get_family("sgemm")
    plan = PLAN
    if args.shapes:
        wanted = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        known = {shape: entry for shape, *entry in PLAN}
        plan = [(shape, *known.get(shape, (8, 30, 5))) for shape in wanted]
    report["plan"] = []

    def options(_problem) -> dict:
        """The next shape's trials, search limit (cut by the deadline, asked just before its
        search) and finalists; recorded in the report."""
        index = len(report["plan"])
        (m, n, k), trials, limit_s, top_k = plan[index]
        timeout_s = shape_limit(limit_s, deadline, len(plan) - index - 1)
        trials = args.trials or trials
        report["plan"].append({"shape": f"{m}x{n}x{k}", "trials": trials, "timeout_s": round(timeout_s, 1),
                               "top_k": top_k})
        print(f"-- {m}x{n}x{k}: {trials} trials, {timeout_s:.0f} s, {len(plan) - index - 1} shapes after it, "
              f"{deadline - time.monotonic():.0f} s left", file=sys.stderr, flush=True)
        return {"trials": trials, "timeout_s": timeout_s, "top_k": top_k, "db_url": db_url, "workers": WORKERS}

    rows = []
    for problem, _result, doc in tune_each([family.problem(m=m, n=n, k=k) for (m, n, k), *_ in plan], options):
        winner = doc["winner"]
        if winner is not None:
            flops = family.flops(problem)
            winner["pct_of_fp32_peak"] = round(100.0 * winner["tflop_per_s"] / peak["tflop_per_s"], 1)
            if winner.get("peer_time_us"):
                peer_tflops = flops / (winner["peer_time_us"] * 1e-6) / 1e12
                winner["peer_tflop_per_s"] = round(peer_tflops, 3)
                winner["peer_pct_of_fp32_peak"] = round(100.0 * peer_tflops / peak["tflop_per_s"], 1)
            try:
                winner["resources"] = winner_resources(family, problem, winner["params"], args.out)
            except Exception as exc:  # the report stands without it
                winner["resources"] = {"error": f"{type(exc).__name__}: {exc}"}
        rows.append(doc)
        write_results(args.out, "sgemm", peak["gpu"], {**report, "shapes": rows})
    report["shapes"] = rows
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["budget_s"] = args.budget_s
    square = [d for d in rows if d["winner"] and d["problem"]["shape"] in
              ({"m": 4096, "n": 4096, "k": 4096}, {"m": 8192, "n": 8192, "k": 8192})]
    others = [d for d in rows if d["winner"] and d not in square]
    report["targets"] = {
        "square_at_least_90pct_of_cublas": {shape_text(d): d["winner"].get("speedup_vs_peer") for d in square},
        "other_shapes_at_or_above_cublas": sum(1 for d in others if (d["winner"].get("speedup_vs_peer") or 0) >= 1.0),
        "other_shapes_needed": 3,
    }
    write_results(args.out, "sgemm", peak["gpu"], report)

    if "cli_cold_start" in report:
        cli = report["cli_cold_start"]
        print(f"\ncold-start `autogen tune sgemm --m 4096 --n 4096 --k 4096` (default budget): {cli['wall_s']} s, "
              + ("timed out" if cli.get("timed_out") else f"exit {cli['exit_code']}"))
    print(f"\nmeasured FP32 FMA peak on {peak['gpu']}: {peak['tflop_per_s']} TFLOP/s; shapes {report['wall_s']} s "
          f"(budget {args.budget_s:.0f} s)")
    print(table(("shape", "winner (sgemm_f32_...)", "us", "TFLOP/s", "%peak", "cuBLAS us", "TFLOP/s", "%peak",
                 "speedup", "regs", "b/SM", "lmem", "n", "tune s"), map(row_cells, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
