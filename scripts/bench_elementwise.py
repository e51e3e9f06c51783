"""The gelu and bias_mask_scale_add benchmark: tune each problem (cold cache, CUDA-graph timing,
medians), then time the PyTorch peers of the same problem in the same run by the same method:
torch eager (F.gelu; the composed (x + bias) * mask * scale + addend) and torch.compile (Inductor)
of the same expression. Writes elementwise_<gpu>.json and prints a table last.

Peers and graphs. The tuner times each winner in CuPy's CUDA graphs, and its family peer there
too (torch's out= forms, which allocate nothing). F.gelu, the composed expression and compiled
code allocate their results and temporaries, which is unsafe inside CuPy's capture; they are timed
here in torch's own CUDA graphs (torch.cuda.CUDAGraph, whose private memory pool makes allocation
during capture safe): L calls rotating over the same number of cold input sets as the tuner uses
(together over 4x L2), captured once per function; the graphs of one problem (autogen's call,
eager, compiled) are replayed in 15 interleaved rounds, each replay timed with CUDA events, the
median per call. torch.compile is warmed up (compiled, autotuned) outside capture. autogen's own
call (autogen.gelu / autogen.bias_mask_scale_add, result allocated like F.gelu's, from the graph's
pool) is timed there too: the speedups over torch are taken between the two in torch's graphs,
the same method. Both recycle the results where they fit in L2 (2^20): torch's graphs two or three
buffers from their pool, the tuner three (autogen.gpu.measure.RECYCLED_RESULTS).

Budget: 27 problems (18 gelu, 9 bias_mask_scale_add), each a tune plus the torch peers: start-up,
the searched trials (NVRTC and the cold timing; the 2^28 trials the longest), the finish (re-timing
the winner and the family peer) and the torch peers, the first problem of each family, form and
dtype paying torch.compile's compile (the parts' times in a run: docs/history/sessions.md). With
--trials 12 about 420 s is the expected total; --budget 420 makes sure of it (each problem's search gets an even share of what is left, less
FIXED_S). --only and --sizes split it; --no-compile skips Inductor (what to drop first if
torch.compile's cold compiles dominate).

Targets on an H100: >= 95% of the copy bandwidth at 2^24 and 2^28, >= 1.0x F.gelu everywhere,
bias_mask_scale_add >= 2.5x torch eager and >= 1.0x torch.compile.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from benchlib import Budget, num, render_table, table, time_torch_functions, tune_each, write_results

SIZES = (2**20, 2**24, 2**28)
DTYPES = ("float32", "float16", "bfloat16")
BIAS_SIZE = 4096
ROUNDS = 15  # interleaved replays of each torch graph (autogen's call, eager, compiled)
FIXED_S = 8.0  # per problem outside the search: start-up, finishing (re-time, family peer), torch peers

PROBLEMS = [
    *[("gelu", dtype, {"n": n, "approximate": form}) for dtype in DTYPES for form in ("tanh", "none") for n in SIZES],
    *[("bias_mask_scale_add", dtype, {"n": n, "bias_size": BIAS_SIZE}) for dtype in DTYPES for n in SIZES],
]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and logs")
    parser.add_argument("--db", help="database URL for the winners (default: sqlite in --out)")
    parser.add_argument("--trials", type=int, default=10, help="variants measured per problem (default 10)")
    parser.add_argument("--timeout", type=float, help="stop each problem's search after this many seconds")
    parser.add_argument("--budget", type=float,
                        help="seconds for the whole run: each problem's search gets an even share of what is left "
                             "(less the fixed per-problem cost), capped by --timeout")
    parser.add_argument("--only", choices=["gelu", "bias_mask_scale_add"], help="benchmark one family only")
    parser.add_argument("--sizes", help="comma list of n to run (default 2^20,2^24,2^28)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    parser.add_argument("--compile-static", action="store_true",
                        help="torch.compile with dynamic=False: one compile per size (slower to run)")
    return parser.parse_args(argv)


# -- torch peers in torch's CUDA graphs -------------------------------------------------------------


def torch_functions(torch, family: str, approximate: str | None, dtype: str, compile_cache: dict, use_compile: bool,
                    static: bool = False):
    """(eager, compiled or None) taking the tensors of one input set and returning the result."""
    F = torch.nn.functional
    if family == "gelu":
        def eager(t):
            return F.gelu(t["x"], approximate=approximate)
    else:
        def eager(t):
            # As a user writes it: bias broadcast over rows of bias_size, uint8 mask (the result
            # stays in x's dtype), temporaries allocated by each operation.
            return ((t["x"].view(-1, t["bias"].numel()) + t["bias"]) * t["mask"].view(-1, t["bias"].numel())
                    * t["scale"] + t["addend"].view(-1, t["bias"].numel()))
    compiled = None
    if use_compile:
        key = (family, approximate, dtype)
        if key not in compile_cache:
            # One compiled function per expression and dtype. dynamic=True (the default here): one
            # compile serves every size (Triton still specializes its launch on the sizes'
            # divisibility by 16); --compile-static: dynamic=False, a compile per size (three per
            # function, within dynamo's recompile limit) for fully static kernels.
            compile_cache[key] = torch.compile(eager, dynamic=not static)
        compiled = compile_cache[key]
    return eager, compiled


def autogen_function(problem):
    """autogen's dispatched call on one input set, its result allocated (from torch's graph pool
    under capture), as F.gelu's is."""
    import autogen

    if problem.family == "gelu":
        approximate = problem.shape["approximate"]
        return lambda t: autogen.gelu(t["x"], approximate=approximate)
    return lambda t: autogen.bias_mask_scale_add(t["x"], t["bias"], t["mask"], t["scale"], t["addend"])


def torch_input_sets(torch, family, problem, cupy, l2_bytes: int):
    """The tuner's timing inputs (same case, same number of cold sets), as torch tensors."""
    from autogen.gpu.measure import timing_sets
    from autogen.gpu.peers import as_tensor

    free, _total = cupy.cuda.runtime.memGetInfo()
    rng = cupy.random.default_rng(1)
    # Room for the results and temporaries of the expression under capture: a quarter of free memory.
    sets = timing_sets(family, problem, cupy, rng, True, l2_bytes, free // 2)
    dtypes = {"x": problem.dtype, "y": problem.dtype}
    if problem.family == "bias_mask_scale_add":
        dtypes.update(bias=problem.dtype, addend=problem.dtype, mask="uint8")
    tensors = []
    for inputs in sets:
        t = {key: as_tensor(torch, inputs[key], dtype) for key, dtype in dtypes.items()}
        if "scale" in inputs:
            t["scale"] = float(inputs["scale"])
        tensors.append(t)
    return sets, tensors


def check_peer_output(torch, family, problem, fn, inputs, tensors) -> float:
    """Relative L2 error of a peer's result against the float64 reference (peers are checked too)."""
    import cupy

    from autogen.core.compare import relative_error

    result = fn(tensors).reshape(-1)
    if problem.dtype == "bfloat16":
        result = result.view(torch.uint16)
    expected = family.reference(problem, inputs, cupy)
    magnitude = family.reference_magnitude(problem, inputs, cupy)
    values = cupy.asarray(result)
    if problem.dtype == "bfloat16":
        from autogen.core.dtypes import to_float64
        values = to_float64(cupy, values, "bfloat16")
    error, reason = relative_error(cupy, values, expected, magnitude)
    return math.inf if reason else error


def time_torch_peers(problem, family, use_compile: bool, compile_cache: dict, static: bool = False) -> dict:
    """Time the torch peers of one problem; every failure is reported, never raised."""
    result: dict = {}
    try:
        import torch
    except ImportError:
        return {"unavailable": "PyTorch is not importable"}
    if not torch.cuda.is_available():
        return {"unavailable": "torch sees no CUDA device"}
    import cupy

    from autogen.gpu.device import device_identity

    sets, tensors = torch_input_sets(torch, family, problem, cupy, device_identity().l2_bytes)
    result["input_sets"] = len(sets)
    eager, compiled = torch_functions(torch, problem.family, problem.shape.get("approximate"), problem.dtype,
                                      compile_cache, use_compile, static)
    functions = {"autogen": autogen_function(problem), "eager": eager, "compile": compiled}
    result.update(time_torch_functions(  # the check compiles and autotunes
        torch, functions, tensors, lambda _label, fn, s=sets[0], t=tensors[0]: check_peer_output(
            torch, family, problem, fn, s, t), ROUNDS))
    del sets, tensors
    cupy.get_default_memory_pool().free_all_blocks()
    return result


def parse_size(text: str) -> int:
    """"2^20" or "1048576"."""
    text = text.strip()
    if text.startswith("2^"):
        return 2 ** int(text[2:])
    return int(text)


# -- report ---------------------------------------------------------------------------------------


def label_of(doc: dict) -> str:
    p = doc["problem"]
    shape = p["shape"]
    name = "gelu" if p["family"] == "gelu" else "bmsa"
    extra = f" {shape['approximate']}" if "approximate" in shape else ""
    return f"{name}{extra} {p['dtype'].replace('float', 'f')} 2^{int(math.log2(shape['n']))}"


def summarize(doc: dict) -> dict:
    """Speedups and targets of one problem."""
    w = doc.get("winner") or {}
    ours = w.get("time_us")
    peers = doc.get("torch", {})
    out = {"ours_us": ours, "gb_per_s": w.get("gb_per_s"), "pct_copy": w.get("pct_of_floor"),
           "family_peer": w.get("peer"), "family_peer_speedup": w.get("speedup_vs_peer")}
    # The speedups over torch compare like with like: autogen's call and torch's, both in torch's
    # graphs; the tuner's figure (CuPy's graphs, cold inputs, recycled results) when that is missing.
    ours_in_torch = peers.get("autogen", {}).get("time_us")
    out["autogen_torch_graph_us"] = ours_in_torch
    mine = ours_in_torch or ours
    for label in ("eager", "compile"):
        t = peers.get(label, {}).get("time_us")
        out[f"{label}_us"] = t
        out[f"{label}_speedup"] = round(t / mine, 3) if t and mine else None
        if t and doc.get("bytes_moved"):
            out[f"{label}_gb_per_s"] = round(doc["bytes_moved"] / (t * 1e-6) / 1e9, 1)
    family, n = doc["problem"]["family"], doc["problem"]["shape"]["n"]
    targets = {}
    if ours is not None and n >= 2**24:
        targets["95pct_copy"] = (w.get("pct_of_floor") or 0) >= 95.0
    if family == "gelu" and out["eager_speedup"] is not None:
        targets["vs_F.gelu>=1.0"] = out["eager_speedup"] >= 1.0
    if family == "bias_mask_scale_add":
        if out["eager_speedup"] is not None:
            targets["vs_eager>=2.5"] = out["eager_speedup"] >= 2.5
        if out["compile_speedup"] is not None:
            targets["vs_compile>=1.0"] = out["compile_speedup"] >= 1.0
    out["targets"] = targets
    return out


def row_cells(doc: dict) -> tuple:
    s = doc["summary"]
    if s["ours_us"] is None:
        return (label_of(doc), doc.get("no_winner", "no variant passed validation"))
    missed = [k for k, ok in s["targets"].items() if not ok]
    return (label_of(doc), num(s["ours_us"], ".2f"), num(s["gb_per_s"], ".0f"), num(s["pct_copy"], ".1f"),
            num(s.get("autogen_torch_graph_us"), ".2f"), num(s["eager_us"], ".2f"), num(s["eager_speedup"], ".2f"),
            num(s["compile_us"], ".2f"), num(s["compile_speedup"], ".2f"), num(s["family_peer_speedup"], ".2f"),
            "ok" if not missed else "MISS " + ",".join(missed), doc["winner"]["kernel"])


HEADER = ("problem", "us", "GB/s", "%copy", "torch g", "eager us", "x eag", "compile", "x comp", "x out=", "targets",
          "kernel")


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from autogen.core.registry import get_family

    db_url = args.db or f"sqlite:///{args.out / 'bench_elementwise.db'}"
    from autogen.runtime import dispatch
    dispatch._default_dispatcher = dispatch.Dispatcher(db_url)  # autogen's calls serve this run's winners
    sizes = tuple(parse_size(text) for text in args.sizes.split(",")) if args.sizes else SIZES
    compile_cache: dict = {}
    rows = []
    started_all = time.monotonic()
    selected = [get_family(f).problem(d, **dims) for f, d, dims in PROBLEMS
                if not (args.only and f != args.only) and dims["n"] in sizes]
    budget = Budget(total_s=args.budget, fixed_s=FIXED_S, at_least_s=1.0, timeout_s=args.timeout)
    for problem, _result, doc in tune_each(selected, {"trials": args.trials, "db_url": db_url}, budget,
                                           started=started_all):
        tuned_s = doc.pop("bench_wall_s")
        started = time.monotonic()
        doc["torch"] = time_torch_peers(problem, get_family(problem.family), not args.no_compile, compile_cache,
                                        args.compile_static)
        doc["summary"] = summarize(doc)
        doc["bench_wall_s"] = {"tune": tuned_s, "torch": round(time.monotonic() - started, 1)}
        rows.append(doc)
        write_results(args.out, "elementwise", rows[0]["gpu"], {"problems": rows})
        print(render_table([row_cells(doc)]), file=sys.stderr, flush=True)

    copy = next((d["copy_bandwidth_gb_per_s"] for d in rows if d.get("copy_bandwidth_gb_per_s")), None)
    gpu = rows[0]["gpu"] if rows else "?"
    print(f"\n{gpu}, copy bandwidth {copy} GB/s (read + write), cold input sets, CUDA-graph medians; "
          f"us: the tuner's time (CuPy graphs); torch g: autogen's call in torch's graphs; x eag/x comp: "
          f"torch eager and torch.compile over torch g (all in torch graphs); x out=: the family peer (torch's "
          f"out= form) over us (both in CuPy graphs); total {time.monotonic() - started_all:.0f} s")
    print(table(HEADER, map(row_cells, rows)))
    failures = sorted({f"{label_of(d)} {k}: {v['failed']}" for d in rows for k, v in d.get("torch", {}).items()
                       if isinstance(v, dict) and "failed" in v})
    for line in failures:
        print("peer failed: " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
