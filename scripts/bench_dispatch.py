"""Dispatcher benchmarks (H100): host cost of a call on a cache hit, and regret on untuned shapes.

1. Host time per call on a hit, for every family with Family.example_call (autogen.sgemv(A, x,
   y=y), autogen.reduce_sum(x, out=out), autogen.softmax(x, out=out), and families added later),
   against bare CuPy RawKernel launches of the same kernels with the same arguments (target
   <= 1.1x). The same arrays every call, as in a decode loop: from the third call on, autogen
   serves the call bound (autogen.runtime.bound_calls), in C where autogen/_hitpath.c is built; the same call
   with its remembered calls served from Python is timed beside it. Host time: perf_counter
   around many calls, the GPU kept from becoming the bottleneck by tiny shapes.
2. Regret on shapes that were not tuned: the dispatcher's pick (served from the tuned grid in
   --db) against the shape's own tuned best, both timed in the same evaluator, same method
   (target within 10%).
Usage: python3 scripts/bench_dispatch.py --db URL_OF_TUNED_GRID --out DIR [--overhead-only]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from benchlib import interleaved_medians, table, tune_each, write_results

UNTUNED = [(2048, 16), (8192, 64), (16384, 256), (3000, 1000), (6144, 2048)]


# Small shapes, so that the GPU never becomes the bottleneck of back-to-back launches.
SMALL_SHAPES = {"sgemv": {"m": 1024, "n": 16}, "reduce": {"n": 4096}, "softmax": {"rows": 32, "cols": 128},
                "hgemv": {"m": 1024, "n": 16}, "sgemm": {"m": 64, "n": 64, "k": 64}}


def per_call_us(fns: dict, calls: int, rounds: int = 7) -> dict:
    """Host time per call of each function in `fns` (name -> fn): the median over `rounds`
    rounds, each timing `calls` calls of every function in turn (interleaved, so that a slow
    spell of the host or GPU hits every path alike), synchronised between timings."""
    import cupy

    def sampler(fn):
        def one() -> float:
            started = time.perf_counter()
            for _ in range(calls):
                fn()
            elapsed = (time.perf_counter() - started) / calls * 1e6
            cupy.cuda.Device().synchronize()
            return elapsed
        return one

    for fn in fns.values():
        fn()
    cupy.cuda.Device().synchronize()
    medians = interleaved_medians({name: sampler(fn) for name, fn in fns.items()}, rounds)
    return {name: median for name, (median, _spread) in medians.items()}


def python_served_call(family_name: str):
    """The family's dispatched call with its remembered calls served from Python (the C hit
    path off), made beside the cached one."""
    import autogen.runtime.dispatch as dispatch

    built, cached = dispatch.HitPath, dispatch._calls.pop(family_name, None)
    dispatch.HitPath = None
    try:
        return dispatch.make_call(family_name)
    finally:
        dispatch.HitPath = built
        if cached is not None:
            dispatch._calls[family_name] = cached


def host_overhead(db_url: str, calls: int = 5000, profile: bool = False, rounds: int = 7) -> list[dict]:
    """Host time per dispatched call on a hit, for every family with Family.example_call,
    against bare launches of the same kernel functions with the same arguments: "bare" with
    NumPy scalars (what a user of a CuPy RawKernel writes: np.int32(m), np.float32(alpha)) and
    "bare_preconverted" with the scalars converted once (autogen.core.operands.kernel_scalar), the
    floor of any launch through CuPy, and "bind" the family's argument checks alone (no launch).
    All are timed interleaved."""
    import cupy

    import autogen
    import autogen.runtime.dispatch as dispatch
    from autogen.core.family import Family
    from autogen.core.registry import all_families

    dispatch._default_dispatcher = dispatch.Dispatcher(db_url)
    device = cupy.cuda.runtime.getDevice()
    rows = []
    for family in all_families().values():
        if not family.api or type(family).example_call is Family.example_call:
            print(f"{family.name}: no example_call hook, skipped", file=sys.stderr)
            continue
        dims = SMALL_SHAPES.get(family.name) or getattr(family, "example_dims", None) \
            or {d: 256 for d in family.dims}
        problem = family.problem(None, **dims)
        args, kwargs = family.example_call(problem, cupy)
        call = getattr(autogen, family.api)
        call(*args, **kwargs)  # builds the kernel: every later call is a hit
        kernel = dispatch.default_dispatcher().lookup(problem)
        _, inputs, _ = family.bind(cupy, device, args, kwargs)
        steps = [(function, grid, block, step_args(inputs), shared)
                 for function, grid, block, step_args, shared in kernel._launches]
        numpy_steps = [(f, g, b, tuple(getattr(a, "held", a) for a in values), sh) for f, g, b, values, sh in steps]

        def bare(steps=numpy_steps):
            for function, grid, block, values, shared in steps:
                function(grid, block, values, shared)

        def preconverted(steps=steps):
            for function, grid, block, values, shared in steps:
                function(grid, block, values, shared)

        def dispatched(call=call, args=args, kwargs=kwargs):
            call(*args, **kwargs)

        def dispatched_python(call=python_served_call(family.name), args=args, kwargs=kwargs):
            call(*args, **kwargs)

        def bind_only(bind=family.bind, args=args, kwargs=kwargs):  # the checks, no launch
            bind(cupy, device, args, kwargs)

        times = per_call_us({"bare": bare, "preconverted": preconverted, "dispatched": dispatched,
                             "dispatched_python": dispatched_python, "bind": bind_only}, calls, rounds)
        bare_us, floor_us, ours_us = times["bare"], times["preconverted"], times["dispatched"]
        rows.append({"family": family.name, "shape": problem.shape_key, "dtype": problem.dtype,
                     "kernel": kernel.name, "served_by": kernel.served_by, "launches": len(steps),
                     "bare_rawkernel_us": round(bare_us, 3), "bare_preconverted_us": round(floor_us, 3),
                     "bind_only_us": round(times["bind"], 3),
                     "hit_path": "C" if getattr(call, "configured", False) else "Python",
                     "autogen_us": round(ours_us, 3), "ratio_vs_bare": round(ours_us / bare_us, 3),
                     "autogen_python_hit_us": round(times["dispatched_python"], 3),
                     "ratio_python_hit_vs_bare": round(times["dispatched_python"] / bare_us, 3),
                     "ratio_vs_preconverted": round(ours_us / floor_us, 3)})
        if profile:
            print(f"--- {family.name}: where the host time of a dispatched call goes", file=sys.stderr)
            profile_hot_path(dispatched)
    return rows


def profile_hot_path(fn, calls: int = 5000) -> None:
    """Where the host time of a dispatched call goes (printed; kept for the notes)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(12)


def regret(db_url: str, out: Path, trials: int) -> list[dict]:
    from tuning_db import TuningDB

    import autogen.runtime.dispatch as dispatch
    from autogen.gpu.compile import compile_cubin
    from autogen.core.registry import get_family
    from autogen.core.render import render
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    family = get_family("sgemv")
    own_db = f"sqlite:///{out / 'regret_own.db'}"
    rows = []
    for problem, result, _summary in tune_each([family.problem(m=m, n=n) for m, n in UNTUNED],
                                               {"trials": trials, "db_url": own_db}):
        m, n = problem["m"], problem["n"]
        pick = dispatch.Dispatcher(db_url).lookup(problem)
        best = result.winner
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
    parser.add_argument("--calls", type=int, default=5000, help="calls per timing")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (the median is reported)")
    parser.add_argument("--overhead-only", action="store_true", help="skip the regret measurement")
    parser.add_argument("--profile", action="store_true",
                        help="print (stderr) a cProfile of every family's dispatched call")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from autogen.gpu.device import device_identity

    report = {"host_overhead": host_overhead(args.db, args.calls, args.profile, args.rounds), "regret": []}
    write_results(args.out, "dispatch", device_identity().name, report)  # kept should the regret fail
    if not args.overhead_only:
        report["regret"] = regret(args.db, args.out, args.trials)
        write_results(args.out, "dispatch", device_identity().name, report)
    print(table(("family", "shape", "launches", "bare us", "floor us", "bind us", "autogen us", "vs bare", "vs floor",
                 "hit", "Python hit us", "vs bare"),
                ((h["family"], h["shape"], h["launches"], h["bare_rawkernel_us"], h["bare_preconverted_us"],
                  h["bind_only_us"], h["autogen_us"], f"{h['ratio_vs_bare']}x", f"{h['ratio_vs_preconverted']}x",
                  h["hit_path"], h["autogen_python_hit_us"], f"{h['ratio_python_hit_vs_bare']}x")
                 for h in report["host_overhead"])))
    if report["regret"]:
        print(table(("shape", "served", "from", "pick us", "best us", "regret"),
                    ((r["shape"], r["served_by"], r["from_shape"], f"{r['pick_us']:.3f}", f"{r['own_best_us']:.3f}",
                      f"{r['regret_pct']:.1f}%") for r in report["regret"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
