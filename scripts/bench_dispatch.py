"""Dispatcher benchmarks (H100): host cost of a call on a cache hit, and regret on untuned shapes.

1. Host time per call of autogen.sgemv(A, x, y=y) on a hit, against a bare CuPy RawKernel launch
   of the same kernel with the same arguments (target <= 1.3x). Host time: perf_counter around
   many calls, the GPU kept from becoming the bottleneck by a tiny shape.
2. Regret on shapes that were not tuned: the dispatcher's pick (served from the tuned grid in
   --db) against the shape's own tuned best, both timed in the same evaluator, same method
   (target within 10%).
Usage: python3 scripts/bench_dispatch.py --db URL_OF_TUNED_GRID --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

UNTUNED = [(2048, 16), (8192, 64), (16384, 256), (3000, 1000), (6144, 2048)]


def host_overhead(db_url: str, calls: int = 20000) -> dict:
    import cupy

    import autogen
    import autogen.dispatch as dispatch
    from autogen.family import get_family
    from autogen.render import render

    dispatch._default_dispatcher = dispatch.Dispatcher(db_url)
    m, n = 1024, 16
    A = cupy.random.random((m, n), dtype=cupy.float32)
    x = cupy.random.random(n, dtype=cupy.float32)
    y = cupy.empty(m, dtype=cupy.float32)
    kernel = autogen.lookup("sgemv", m=m, n=n)
    family = get_family("sgemv")
    config = family.space.check(kernel.params)
    raw = cupy.RawModule(code=render(family, "float32", config), options=("-std=c++17",)).get_function(kernel.name)
    step = family.plan(kernel.problem, config)[0]
    args = (A, x, y, cupy.int32(m), cupy.int32(n), cupy.float32(1.0), cupy.float32(0.0))

    def bare():
        raw(step.launch.grid, step.launch.block, args)

    def dispatched():
        autogen.sgemv(A, x, y=y)

    def per_call(fn) -> float:
        fn()
        cupy.cuda.Device().synchronize()
        samples = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - started) / calls * 1e6)
            cupy.cuda.Device().synchronize()
        return statistics.median(samples)

    bare_us, dispatched_us = per_call(bare), per_call(dispatched)
    profile_hot_path(dispatched)
    return {"shape": f"{m}x{n}", "kernel": kernel.name, "served_by": kernel.served_by,
            "bare_rawkernel_us": round(bare_us, 3), "autogen_sgemv_us": round(dispatched_us, 3),
            "ratio": round(dispatched_us / bare_us, 3)}


def profile_hot_path(fn, calls: int = 5000) -> None:
    """Where the host time of a dispatched call goes (printed; kept for the notes)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


def regret(db_url: str, out: Path, trials: int) -> list[dict]:
    from tuning_db import TuningDB

    import autogen.dispatch as dispatch
    from autogen.compile import compile_cubin
    from autogen.family import get_family
    from autogen.render import render
    from autogen.tuner import TuneOptions, tune
    from autogen.worker import Evaluator, WorkSpec

    family = get_family("sgemv")
    own_db = f"sqlite:///{out / 'regret_own.db'}"
    rows = []
    for m, n in UNTUNED:
        problem = family.problem(m=m, n=n)
        pick = dispatch.Dispatcher(db_url).lookup(problem)
        best = tune(problem, TuneOptions(trials=trials, db_url=own_db)).winner
        evaluator = Evaluator(WorkSpec("sgemv", "float32", problem.dims))
        names, candidates = {}, {}
        for label, params in (("pick", pick.params), ("own_best", best.trial.params)):
            config = family.space.check(params)
            names[label] = family.kernel_name("float32", config)
            candidates[names[label]] = (compile_cubin(render(family, "float32", config), evaluator.device.arch),
                                        config.as_dict())
        # Both timed interleaved in one evaluator, same method as tuning.
        samples = evaluator.retime([(name, cubin, params) for name, (cubin, params) in candidates.items()], 7)
        pick_us = statistics.median(samples[names["pick"]])
        best_us = statistics.median(samples[names["own_best"]])
        timed = {label: (name, None) for label, name in names.items()}
        rows.append({"shape": f"{m}x{n}", "served_by": pick.served_by,
                     "from_shape": pick.provenance.get("tuned_shape"), "pick": timed["pick"][0],
                     "pick_us": round(pick_us, 3), "own_best": timed["own_best"][0],
                     "own_best_us": round(best_us, 3), "regret_pct": round(100 * (pick_us / best_us - 1), 1)})
        TuningDB(own_db).close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True, help="database holding the tuned grid")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--overhead-only", action="store_true", help="skip the regret measurement")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"host_overhead": host_overhead(args.db),
              "regret": [] if args.overhead_only else regret(args.db, args.out, args.trials)}
    (args.out / "bench_dispatch.json").write_text(json.dumps(report, indent=2))
    h = report["host_overhead"]
    print(f"host time per call ({h['shape']}, {h['served_by']}): autogen.sgemv {h['autogen_sgemv_us']} us, "
          f"bare RawKernel {h['bare_rawkernel_us']} us -> {h['ratio']}x")
    print(f"{'shape':>11} {'served':>8} {'from':>14} {'pick us':>8} {'best us':>8} {'regret':>7}")
    for r in report["regret"]:
        print(f"{r['shape']:>11} {r['served_by']:>8} {str(r['from_shape']):>14} {r['pick_us']:>8.3f} "
              f"{r['own_best_us']:>8.3f} {r['regret_pct']:>6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
