"""What the benchmark scripts share: the tune-and-summarise loop, the CUDA-graph timer of torch
peers, interleaved medians, the results file and the table.

The scripts run as `python scripts/bench_x.py` from the repository root: their own folder is then
sys.path[0], so `import benchlib` finds this file (tests put scripts/ on sys.path themselves).
Heavy imports (the tuner, torch) happen inside the functions that need them, so that a script's
--help and the tests that load a script stay fast and need no GPU.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

# `python scripts/bench_x.py` puts scripts/ on sys.path, not the checkout: autogen is found there
# unless PYTHONPATH or an installed autogen comes first.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from autogen.paths import write_atomically  # noqa: E402
from autogen.report import render_table, tune_summary  # noqa: E402

# -- results files ----------------------------------------------------------------------------------

# Words of a device name that say nothing about the model.
MAKER_WORDS = {"nvidia", "geforce", "tesla", "quadro"}


def gpu_short_name(device_name: str | None) -> str:
    """The GPU model as a file name takes it: "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA GeForce RTX 4090" -> "rtx4090"; "unknown_gpu" where there is no name."""
    words = [w for w in re.split(r"[^a-z0-9]+", (device_name or "").lower()) if w and w not in MAKER_WORDS]
    if not words:
        return "unknown_gpu"
    if words[0] in ("rtx", "gtx") and len(words) > 1:
        return words[0] + words[1]
    return words[0]


def results_path(out: Path, name: str, gpu_name: str | None) -> Path:
    """OUT/<name>_<gpu>.json, e.g. hgemv_h100.json: results files are named by family and GPU."""
    return Path(out) / f"{name}_{gpu_short_name(gpu_name)}.json"


def write_results(out: Path, name: str, gpu_name: str | None, doc: dict) -> Path:
    """The whole document, replaced in one step: written after every problem, so a run cut short
    keeps what it measured."""
    path = results_path(out, name, gpu_name)
    write_atomically(path, json.dumps({"gpu": gpu_name, **doc}, indent=2, default=str) + "\n")
    return path


# -- tune and summarise ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """How long each search may run. With total_s, the searches share what is left of it by
    weight (less fixed_s each, for what a problem costs outside its search, and less reserve_s,
    kept for after the loop), each getting at least at_least_s; timeout_s caps every search."""

    total_s: float | None = None
    fixed_s: float = 0.0
    at_least_s: float = 1.0
    reserve_s: float = 0.0
    timeout_s: float | None = None

    def search_s(self, elapsed_s: float, weights_left: list[float]) -> float | None:
        """The limit of the next search, `weights_left` being its weight and those of the
        searches after it."""
        if self.total_s is None:
            return self.timeout_s
        left = self.total_s - elapsed_s - self.reserve_s
        share = max(self.at_least_s, left * weights_left[0] / sum(weights_left) - self.fixed_s)
        return share if self.timeout_s is None else min(self.timeout_s, share)

    def shortfall(self, problems: int) -> str | None:
        """Why total_s is too small for `problems` searches, or None: each search gets at least
        at_least_s whatever is left, so the run then overruns total_s by that much."""
        if self.total_s is None:
            return None
        needed = problems * (self.fixed_s + self.at_least_s) + self.reserve_s
        if self.total_s >= needed:
            return None
        return (f"a budget of {self.total_s:g} s is short for {problems} problems: each needs about "
                f"{self.fixed_s + self.at_least_s:g} s at least ({needed:g} s in all, with {self.reserve_s:g} s kept "
                f"for after them); the run will take longer than its budget")


def tune_each(problems: list, options: dict | Callable[[object], dict], budget: Budget = Budget(),
              weights: Iterable[float] | None = None, started: float | None = None) -> Iterator[tuple]:
    """Tune every problem in turn (autogen's tuner, TuneOptions(**options), the search limited
    by `budget`); yields (problem, result, summary) after each, the summary being
    autogen.report.tune_summary's document (winner and peer time, speedup, % of floor, GPU)
    plus bench_wall_s. `options` may be a function of the problem; `started` is when the run
    began (time.monotonic()), where it began before the loop."""
    from autogen.search.tuner import TuneOptions, tune

    started = time.monotonic() if started is None else started
    weights = list(weights) if weights is not None else [1.0] * len(problems)
    short = budget.shortfall(len(problems))
    if short:
        print(f"warning: {short}", file=sys.stderr, flush=True)
    for index, problem in enumerate(problems):
        kwargs = dict(options(problem) if callable(options) else options)
        limit = budget.search_s(time.monotonic() - started, weights[index:])
        if limit is not None:
            kwargs["timeout_s"] = limit
        begun = time.monotonic()
        result = tune(problem, TuneOptions(**kwargs))
        summary = tune_summary(result)
        summary["bench_wall_s"] = round(time.monotonic() - begun, 1)
        yield problem, result, summary


# -- tables ---------------------------------------------------------------------------------------


def num(value, spec: str) -> str | None:
    """`value` formatted, or None (shown "-" by the table) where it is missing."""
    return None if value is None else format(value, spec)


def shape_text(summary: dict) -> str:
    return "x".join(str(v) for v in summary["problem"]["shape"].values())


WINNER_HEADER = ("kernel", "us", "peer us", "speedup", "GB/s", "%floor")


def winner_cells(summary: dict) -> tuple:
    """The winner's columns of a summary (WINNER_HEADER); where there is none, why, then dashes."""
    w = summary.get("winner")
    if not w:
        return (summary.get("no_winner", "no variant passed validation"),) + (None,) * (len(WINNER_HEADER) - 1)
    return (w["kernel"], num(w.get("time_us"), ".3f"), num(w.get("peer_time_us"), ".3f"),
            num(w.get("speedup_vs_peer"), ".2f"), num(w.get("gb_per_s"), ".0f"), num(w.get("pct_of_floor"), ".1f"))


def table(header: Iterable[str], rows: Iterable[Iterable]) -> str:
    return render_table([tuple(header), *(tuple(row) for row in rows)])


# -- timing ---------------------------------------------------------------------------------------

# A torch graph holds about this long a replay, at most MAX_CALLS calls.
TARGET_REPLAY_US = 2000.0
MAX_CALLS = 2000
# Results kept alive during capture: older ones are freed and their blocks reused from the graph's
# pool, as a caching allocator recycles results between calls.
LIVE_RESULTS = 2


def interleaved_medians(samplers: dict[str, Callable[[], float]], rounds: int) -> dict[str, tuple[float, float]]:
    """{label: (median, max - min)} of `rounds` samples of each sampler, taken in rounds that
    sample every label once, in alternating order: a drift of the GPU's or the host's state over
    the run reaches every label alike."""
    samples: dict = {label: [] for label in samplers}
    labels = list(samplers)
    for round_ in range(rounds):
        for label in labels if round_ % 2 == 0 else labels[::-1]:
            samples[label].append(samplers[label]())
    return {label: (statistics.median(s), max(s) - min(s)) for label, s in samples.items()}


def torch_graph(torch, call: Callable[[int], object], sets: int):
    """(graph, calls): call(i) for i rotating over `sets` input sets, captured in a
    torch.cuda.CUDAGraph (its private memory pool makes allocation during capture safe) of about
    TARGET_REPLAY_US per replay, as many calls as a probe graph says, a multiple of `sets`."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as torch's graph docs ask
        for i in range(2):
            call(i % sets)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    probe_calls = max(sets, 8)
    probe = _captured(torch, call, sets, probe_calls)
    estimate = min(torch_replay_us(torch, probe, probe_calls) for _ in range(2))
    del probe
    calls = graph_calls(sets, estimate)
    return _captured(torch, call, sets, calls), calls


def graph_calls(sets: int, estimate_us: float) -> int:
    """Calls in a graph of about TARGET_REPLAY_US (at most MAX_CALLS), given the time of one:
    whole passes over the sets, at least one."""
    calls = max(sets, min(MAX_CALLS, math.ceil(TARGET_REPLAY_US / max(estimate_us, 0.5))))
    return math.ceil(calls / sets) * sets


def _captured(torch, call, sets: int, calls: int):
    graph = torch.cuda.CUDAGraph()
    results = []
    with torch.cuda.graph(graph):
        for i in range(calls):
            results.append(call(i % sets))
            if len(results) > LIVE_RESULTS:
                results.pop(0)
    results.clear()
    graph.replay()  # warm replay: uploads the graph, touches every set
    torch.cuda.synchronize()
    return graph


def torch_replay_us(torch, graph, calls: int) -> float:
    """One replay of `graph`, timed with CUDA events: us per call."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1000.0 / calls


def torch_graph_medians(torch, graphs: dict, rounds: int) -> dict[str, tuple[float, float]]:
    """{label: (median us per call, spread)} of torch graphs {label: (graph, calls)} replayed
    interleaved (interleaved_medians)."""
    return interleaved_medians({label: (lambda g=graph, c=calls: torch_replay_us(torch, g, c))
                                for label, (graph, calls) in graphs.items()}, rounds)


def time_torch_functions(torch, functions: dict, tensors: list, check: Callable[[str, Callable], float],
                         rounds: int) -> dict:
    """{label: {"error", "wall_s", "time_us", "spread_us"}, or {"failed": why}} of each function of
    one input set's tensors (None: left out): check(label, fn) first, on one set (it compiles and
    loads the kernels) returning its error; then fn captured rotating over `tensors` (torch_graph);
    the graphs replayed in `rounds` interleaved rounds (torch_graph_medians). A function that fails
    is reported and the others go on; the graphs' memory is released before returning."""
    result: dict = {}
    graphs = {}
    for label, fn in functions.items():
        if fn is None:
            continue
        started = time.monotonic()
        try:
            error = check(label, fn)
            graphs[label] = torch_graph(torch, lambda i, fn=fn: fn(tensors[i]), len(tensors))
            result[label] = {"error": error, "wall_s": round(time.monotonic() - started, 1)}
        except Exception as exc:  # report and go on: one peer failing must not end the benchmark
            result[label] = {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
    for label, (median, spread) in torch_graph_medians(torch, graphs, rounds).items():
        result[label].update(time_us=round(median, 4), spread_us=round(spread, 4))
    del graphs
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return result


def cold_input_sets(cupy, family, problem, seed: int = 12345) -> list[dict]:
    """The rotating input sets (more than L2 holds together) the tuner times `problem` on, made
    the same way for a benchmark's kernels and peers."""
    from autogen.gpu.device import device_identity, free_device_memory
    from autogen.gpu.measure import timing_sets

    rng = cupy.random.default_rng(seed)
    return timing_sets(family, problem, cupy, rng, True, device_identity().l2_bytes, free_device_memory())
