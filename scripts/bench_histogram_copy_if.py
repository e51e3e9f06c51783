"""The histogram and copy_if benchmark: tune each problem of the issue (winners land in --db),
then time each winner and its peers in this process, on the same cold input sets, by the same
CUDA-graph method (autogen.gpu.measure.time_enqueue), and print a table last.

Peers: CUB (DeviceHistogram::HistogramEven, DeviceSelect::If) from scripts/cub_peers.cu, built
with nvcc in the background at the start; torch.histc (on a float32 copy of x made outside the
timing, its most favourable case) in a torch.cuda.CUDAGraph; torch.bincount and
torch.masked_select synchronise with the host to size their output, so no graph can hold them:
they are timed with events around back-to-back calls, the method named in the JSON.

Targets on an H100: histogram >= 1.0x CUB on uniform data and >= 1.5x the best torch peer on
skewed data; ordered copy_if >= 0.9x CUB DeviceSelect and >= 1.5x torch.masked_select;
unordered copy_if >= 1.2x CUB. Each row reports input GB/s (4 n bytes / time) and the share of
the measured copy bandwidth (bytes moved / time / copy GB/s).

    python scripts/bench_histogram_copy_if.py --out DIR [--db URL] [--hist-trials N] [--copy-if-trials N]
                                              [--trials N (both)] [--budget S] [--only FAMILY]

Time: histogram gets 6 trials per problem (the default and the nearest tuned shapes' winners
first), copy_if 40, each search stopping at its weighted share of --budget (copy_if at 2^28 four
times histogram's share, at 2^24 twice): under ~300 s on an H100 in all.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import Budget, cold_input_sets, num, table, torch_graph, torch_graph_medians, tune_each, write_results  # noqa: E402

PROBLEMS = [
    *[("histogram", "int32", {"n": n, "bins": bins, "distribution": dist})
      for n in (2**24, 2**28) for bins in (256, 4096) for dist in ("uniform", "skewed")],
    *[("copy_if", "int32", {"n": n, "selectivity": sel, "order": order})
      for n in (2**24, 2**28) for order in ("ordered", "unordered") for sel in ("p01", "p50", "p99")],
]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON, the CUB library and logs")
    parser.add_argument("--db", help="tuning database URL (default: DIR/bench_histogram_copy_if.db)")
    parser.add_argument("--trials", type=int, default=None,
                        help="variants measured per problem, both families (default: --hist-trials / --copy-if-trials)")
    parser.add_argument("--hist-trials", type=int, default=6,
                        help="histogram variants per problem (default 6: it meets its targets; the default and "
                             "the nearest shapes' winners come first)")
    parser.add_argument("--copy-if-trials", type=int, default=40,
                        help="copy_if variants per problem (default 40)")
    parser.add_argument("--budget", type=float, default=280.0,
                        help="seconds for the whole run; each search gets its weighted share (default 280)")
    parser.add_argument("--only", choices=["histogram", "copy_if"], help="benchmark one family only")
    return parser.parse_args(argv)


def problem_weight(problem) -> float:
    """A search's share of the time budget. histogram meets its targets with a few trials;
    copy_if needs enough to reach the single-pass kernels' good corners, and a trial at 2^28
    (1 GiB read per launch, cold sets) costs several times one at 2^24."""
    family_name, _dtype, dims = problem
    if family_name == "histogram":
        return 1.0
    return 4.0 if dims["n"] >= 2**28 else 2.0


# -- CUB ------------------------------------------------------------------------------------------

def start_cub_build(out: Path, arch: str):
    """nvcc on scripts/cub_peers.cu in the background: (process, library path) or None."""
    library = out / "libautogen_cub_peers.so"
    try:
        process = subprocess.Popen(["nvcc", "-O3", "-std=c++17", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC",
                                    "-o", str(library), str(ROOT / "scripts" / "cub_peers.cu")],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        print(f"CUB peers unavailable: {exc}", file=sys.stderr)
        return None
    return process, library


def start_gpu_and_cub(out: Path):
    """(cupy, torch or None, the GPU's arch, the CUB peers' build started in the background)."""
    from autogen.gpu.device import device_identity, require_cupy
    from autogen.gpu.peers import torch_cuda

    cupy = require_cupy()
    arch = device_identity().arch
    build = start_cub_build(out, arch)  # first: torch's import overlaps the nvcc build
    return cupy, torch_cuda(), arch, build


def cub_ready(build, wait: bool) -> Path | None:
    """The library once nvcc has finished (named in AUTOGEN_CUB_PEERS for the tuner's peers)."""
    from autogen.families import cub_peers

    if build is None:
        return None
    process, library = build
    if process.poll() is None and not wait:
        return None
    if process.wait() != 0:
        print("CUB peers failed to build:\n" + process.stdout.read()[-2000:], file=sys.stderr)
        return None
    if os.environ.get(cub_peers.ENV) != str(library):
        os.environ[cub_peers.ENV] = str(library)
        cub_peers.cub_library.cache_clear()
    return library


# -- timing in this process -----------------------------------------------------------------------

def winner_launcher(cupy, family, problem, params: dict, arch: str):
    from autogen.gpu.compile import compile_cubin
    from autogen.core.render import render

    config = family.space.check(params)
    name = family.kernel_name(problem.dtype, config, problem.traits)  # traits that change the code name it
    module = cupy.cuda.function.Module()
    module.load(compile_cubin(render(family, problem.dtype, config, traits=problem.traits), arch))
    steps = [(module.get_function(name + s.suffix), s) for s in family.plan(problem, config)]

    def launch(inputs: dict) -> None:
        for function, step in steps:
            function(step.launch.grid, step.launch.block, step.args(inputs), shared_mem=step.launch.shared_bytes)

    launch.module = module
    return launch


def graph_us(cupy, enqueue, sets: int) -> float:
    from autogen.gpu.measure import time_enqueue
    return time_enqueue(cupy, enqueue, sets).median_us


def torch_graph_us(torch, call, sets: int, replays: int = 7) -> float:
    """`call(i)` rotating over the sets in a torch CUDA graph (benchlib.torch_graph): the median
    over replays of the time per call."""
    return torch_graph_medians(torch, {"peer": torch_graph(torch, call, sets)}, replays)["peer"][0]


def torch_events_us(torch, call, sets: int, replays: int = 7) -> float:
    """Back-to-back calls timed with events (for calls that synchronise with the host)."""
    for i in range(3):
        call(i % sets)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    rounds = max(sets, 20)
    for _ in range(replays):
        start.record()
        for i in range(rounds):
            call(i % sets)
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1000 / rounds)
    return statistics.median(samples)


def measure(cupy, torch, family, problem, params: dict, arch: str) -> dict:
    """Winner, CUB and torch on the same cold input sets; each peer's output checked once."""
    from autogen.families.cub_peers import cub_library

    sets = cold_input_sets(cupy, family, problem)
    k = len(sets)
    expected = family.reference(problem, sets[0], cupy)
    times: dict[str, float] = {}
    methods: dict[str, str] = {}
    checks: dict[str, bool] = {}

    def check(name: str, inputs: dict) -> None:
        error, _reason = family.compare(problem, inputs, expected, None, cupy)
        checks[name] = error == 0.0

    launch = winner_launcher(cupy, family, problem, params, arch)
    times["autogen"] = graph_us(cupy, lambda i, sets=sets: launch(sets[i]), k)
    methods["autogen"] = "cuda graph"
    check("autogen", sets[0])

    cub = cub_library()
    if cub is not None:
        peer = (cub.histogram_peer(cupy, problem["n"], problem["bins"]) if family.name == "histogram"
                else cub.select_peer(cupy, problem.dtype, problem["n"]))
        times["cub"] = graph_us(cupy, lambda i, sets=sets: peer.run(sets[i]), k)
        methods["cub"] = peer.name + ", cuda graph"
        check("cub", sets[0])

    if torch is not None:
        cupy.cuda.get_current_stream().synchronize()
        try:
            torch_peers(torch, family, problem, sets, expected, times, methods, checks)
        except Exception as exc:  # a torch peer that cannot run here is reported, not fatal
            methods["torch"] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
    del sets
    cupy.get_default_memory_pool().free_all_blocks()
    return {"us": times, "method": methods, "correct": checks}


def torch_peers(torch, family, problem, sets, expected, times, methods, checks) -> None:
    from autogen.gpu.peers import as_tensor

    k = len(sets)
    xs = [as_tensor(torch, s["x"], problem.dtype) for s in sets]
    if family.name == "histogram":
        bins = problem["bins"]
        want = torch.as_tensor(expected, device="cuda").to(torch.int64)
        xf = [x.float() for x in xs]  # outside the timing: histc's most favourable case
        times["torch.histc"] = torch_graph_us(torch, lambda i: torch.histc(xf[i], bins, 0, bins), k)
        methods["torch.histc"] = "float32 copy of x made beforehand, torch.cuda.CUDAGraph"
        checks["torch.histc"] = bool(torch.equal(torch.histc(xf[0], bins, 0, bins).to(torch.int64), want))
        del xf
        xl = [x.long() for x in xs]  # bincount takes int64 on every torch version
        times["torch.bincount"] = torch_events_us(torch, lambda i: torch.bincount(xl[i], minlength=bins), k)
        methods["torch.bincount"] = "int64 copy of x made beforehand; events around back-to-back calls (it syncs)"
        checks["torch.bincount"] = bool(torch.equal(torch.bincount(xl[0], minlength=bins)[:bins], want))
        return
    thresholds = [s["threshold"] for s in sets]
    times["torch.masked_select"] = torch_events_us(torch, lambda i: torch.masked_select(xs[i], xs[i] > thresholds[i]), k)
    methods["torch.masked_select"] = "events around back-to-back calls (it syncs to size its output)"
    got = torch.masked_select(xs[0], xs[0] > thresholds[0])
    count = int(expected["count"][0])
    checks["torch.masked_select"] = got.numel() == count and bool(torch.equal(
        got.double(), torch.as_tensor(expected["values"][:count], device="cuda")))


def targets(family: str, problem: dict, ratio_cub, ratio_torch) -> dict:
    if family == "histogram":
        if problem["distribution"] == "uniform":
            return {"vs CUB >= 1.0": ratio_cub is not None and ratio_cub >= 1.0}
        return {"vs best torch >= 1.5": ratio_torch is not None and ratio_torch >= 1.5}
    if problem["order"] == "ordered":
        return {"vs CUB >= 0.9": ratio_cub is not None and ratio_cub >= 0.9,
                "vs masked_select >= 1.5": ratio_torch is not None and ratio_torch >= 1.5}
    return {"vs CUB >= 1.2": ratio_cub is not None and ratio_cub >= 1.2}


def label(doc: dict) -> str:
    p = doc["problem"]
    shape = p["shape"]
    n = f"2^{shape['n'].bit_length() - 1}"
    if p["family"] == "histogram":
        return f"hist {n} b{shape['bins']} {shape['distribution'][:4]}"
    return f"copy_if {n} {shape['selectivity']} {shape['order'][:5]}"


def row_cells(doc: dict) -> tuple:
    m = doc.get("measured")
    if not m or "autogen" not in m["us"]:
        return (label(doc), "no winner")
    us = m["us"]
    torch_name = doc.get("best_torch")
    return (label(doc), num(us["autogen"], ".2f"), num(doc["input_gb_per_s"], ".0f"), num(doc["pct_of_copy"], ".1f"),
            num(us.get("cub"), ".2f"), num(doc.get("vs_cub"), ".2f"), num(us.get(torch_name), ".2f"),
            num(doc.get("vs_torch"), ".2f"), "yes" if all(doc["targets"].values()) else "NO", doc["winner"]["kernel"])


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    from autogen.core.registry import get_family

    cupy, torch, arch, build = start_gpu_and_cub(args.out)
    db_url = args.db or f"sqlite:///{args.out / 'bench_histogram_copy_if.db'}"
    selected = [p for p in PROBLEMS if not args.only or p[0] == args.only]
    # ~4 s of start-up and finish per tune; the rest split by weight among the searches left,
    # less the in-process timings at the end (2 s per problem).
    budget = Budget(total_s=args.budget, fixed_s=4.0, at_least_s=4.0, reserve_s=2.0 * len(selected))

    def options(problem) -> dict:
        trials = args.trials or (args.hist_trials if problem.family == "histogram" else args.copy_if_trials)
        return {"trials": trials, "db_url": db_url, "top_k": 3, "retime_rounds": 5}

    docs = []
    cub_ready(build, wait=False)
    problems = [get_family(name).problem(dtype, **dims) for name, dtype, dims in selected]
    for problem, _result, doc in tune_each(problems, options, budget, map(problem_weight, selected), started):
        docs.append((get_family(problem.family), problem, doc))
        print(f"tuned {problem} in {doc['bench_wall_s']} s", file=sys.stderr, flush=True)
        write_results(args.out, "histogram_copy_if", doc["gpu"], {"problems": [d for _f, _p, d in docs]})
        cub_ready(build, wait=False)

    cub_ready(build, wait=True)
    rows = []
    for family, problem, doc in docs:
        winner = doc["winner"]
        if winner is not None:
            measured = measure(cupy, torch, family, problem, winner["params"], arch)
            doc["measured"] = measured
            us = measured["us"]
            n = problem["n"]
            doc["input_gb_per_s"] = round(4 * n / (us["autogen"] * 1e-6) / 1e9, 1)
            copy_gbs = doc.get("copy_bandwidth_gb_per_s")
            doc["pct_of_copy"] = round(100 * doc["bytes_moved"] / (us["autogen"] * 1e-6) / 1e9 / copy_gbs, 1) \
                if copy_gbs else None
            doc["peers_gb_per_s"] = {k: round(4 * n / (v * 1e-6) / 1e9, 1) for k, v in us.items()}
            doc["vs_cub"] = round(us["cub"] / us["autogen"], 3) if "cub" in us else None
            torch_times = {k: v for k, v in us.items() if k.startswith("torch")}
            doc["best_torch"] = min(torch_times, key=torch_times.get) if torch_times else None
            doc["vs_torch"] = round(torch_times[doc["best_torch"]] / us["autogen"], 3) if torch_times else None
            doc["targets"] = targets(family.name, problem.shape, doc["vs_cub"], doc["vs_torch"])
        rows.append(doc)
        still_to_measure = [d for _f, _p, d in docs[len(rows):]]
        write_results(args.out, "histogram_copy_if", doc["gpu"], {"problems": rows + still_to_measure})

    total = time.monotonic() - started
    write_results(args.out, "histogram_copy_if", rows[0]["gpu"] if rows else None,
                  {"problems": rows, "wall_s": round(total, 1), "database": db_url})
    print()
    print(table(("problem", "us", "GB/s in", "%copy", "CUB us", "xCUB", "torch us", "xtorch", "met", "kernel"),
                map(row_cells, rows)))
    print(f"\nGB/s in = 4 n bytes / time; %copy = bytes moved / time / measured copy bandwidth; torch = the "
          f"fastest torch peer (see JSON for methods); wall {total:.0f} s; winners in {db_url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
