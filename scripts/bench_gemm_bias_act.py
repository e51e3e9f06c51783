"""The gemm_bias_act benchmark: tune each problem (cold cache, CUDA-graph timing, medians), then time
autogen's call and the PyTorch peers of the same problem in the same run by the same method, TF32
off (torch.backends.cuda.matmul.allow_tf32 = False): the eager sequence act(torch.baddbmm(bias, A,
B)), torch.bmm(A, B) alone (cuBLAS strided batched, no epilogue), and torch.compile (mode default)
of the eager expression, compiled outside capture, its call captured. Writes
gemm_bias_act_<gpu>.json after every problem and prints a table last.

As scripts/bench_elementwise.py: the torch functions allocate their results, so they (and
autogen's call, result allocated from the graph's pool as torch's are) are timed in torch's own
CUDA graphs, rotating over the tuner's number of cold input sets, the graphs of one problem
replayed in ROUNDS interleaved rounds; speedups are taken between them. % of peak: the FP32 FMA
peak measured on this GPU (autogen.gpu.roofline, the tuner's figure), 2 m n k flops per product.

Targets (issue 37), at 8 x 1024^3 and 64 x 512^3: >= 1.1x the eager sequence, >= 0.95x torch.bmm
alone, >= 1.0x torch.compile.

Time: with --budget S the searches share S less FIXED_S per problem (the torch peers, compiles,
start-up), the named shapes' searches NAMED_WEIGHT times an odd shape's; the named shapes run
first, so a run cut short still has them. All 5 shapes x 3 acts (15 problems), meant to fit ~240 s:

    python3 scripts/bench_gemm_bias_act.py --out OUT --trials 24 --budget 220
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from benchlib import Budget, num, render_table, table, time_torch_functions, tune_each, write_results

NAMED = ((8, 1024, 1024, 1024), (64, 512, 512, 512))
# batch 1 at odd sizes (a linear layer's MatmulAndBiasAndRelu), a small odd batch, a larger one.
ODD = ((1, 4099, 4097, 1027), (12, 257, 1031, 771), (33, 129, 383, 515))
ACTS = ("relu", "gelu", "none")
ROUNDS = 15
FIXED_S = 12.0  # per problem outside its search: start-up, finishing, the torch peers
TARGETS = {"eager": 1.1, "bmm": 0.95, "compile": 1.0}
NAMED_WEIGHT = 3.0  # a named shape's share of the search budget, an odd shape's being 1


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON (and the database)")
    parser.add_argument("--db", help="database URL for the winners (default: sqlite in --out)")
    parser.add_argument("--trials", type=int, default=12, help="variants measured per problem (default 12)")
    parser.add_argument("--budget", type=float, help="seconds for the whole run, shared by the problems' searches")
    parser.add_argument("--acts", default=",".join(ACTS), help="activations (default relu,gelu,none)")
    parser.add_argument("--shapes", default="named,odd",
                        help="named, odd, or BxMxNxK entries, comma-separated (default named,odd)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    return parser.parse_args(argv)


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        found = {"named": list(NAMED), "odd": list(ODD)}.get(part)
        shapes += found if found is not None else [tuple(int(v) for v in part.split("x"))]
    if any(len(s) != 4 for s in shapes):
        raise SystemExit(f"--shapes: each entry is named, odd or BxMxNxK, got {text!r}")
    return shapes


# -- torch peers in torch's CUDA graphs -------------------------------------------------------------


def torch_functions(torch, act: str, compiled_cache: dict, use_compile: bool) -> dict:
    """{label: function of one input set's tensors}: autogen's call, the eager sequence, bmm alone
    and (use_compile) torch.compile of the eager sequence, one compiled function per act."""
    import autogen

    activation = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "none": lambda x: x}[act]

    def eager(t):
        return activation(torch.baddbmm(t["bias"], t["A"], t["B"]))

    functions = {"autogen": lambda t: autogen.gemm_bias_act(t["A"], t["B"], t["bias"], act=act),
                 "eager": eager, "bmm": lambda t: torch.bmm(t["A"], t["B"])}
    if use_compile:
        # One code object serves every act and shape: dynamo's default limit of 8 recompiles would
        # leave the later problems running eager code under the name of torch.compile.
        torch._dynamo.config.recompile_limit = max(64, torch._dynamo.config.recompile_limit)
        if act not in compiled_cache:
            compiled_cache[act] = torch.compile(eager)
        functions["compile"] = compiled_cache[act]
    return functions


def peer_error(family, problem, label: str, fn, inputs, tensors) -> float:
    """Relative L2 error of a function's result against the float64 reference (bmm: of A B alone)."""
    import cupy

    from autogen.core.compare import relative_error

    values = cupy.asarray(fn(tensors))
    if label == "bmm":
        expected = cupy.matmul(inputs["A"].astype(cupy.float64), inputs["B"].astype(cupy.float64))
    else:
        expected = family.reference(problem, inputs, cupy)
    error, reason = relative_error(cupy, values, expected, family.reference_magnitude(problem, inputs, cupy))
    return math.inf if reason else error


def time_torch(problem, family, compiled_cache: dict, use_compile: bool) -> dict:
    """Time autogen's call and the torch peers of one problem; every failure is reported, never raised."""
    try:
        import torch
    except ImportError:
        return {"unavailable": "PyTorch is not importable"}
    if not torch.cuda.is_available():
        return {"unavailable": "torch sees no CUDA device"}
    import cupy

    from autogen.gpu.device import device_identity
    from autogen.gpu.measure import timing_sets
    from autogen.gpu.peers import as_tensor

    torch.backends.cuda.matmul.allow_tf32 = False
    free, _total = cupy.cuda.runtime.memGetInfo()
    sets = timing_sets(family, problem, cupy, cupy.random.default_rng(1), True, device_identity().l2_bytes, free // 2)
    tensors = [{key: as_tensor(torch, s[key], "float32") for key in ("A", "B", "bias")} for s in sets]
    result: dict = {"input_sets": len(sets)}
    functions = torch_functions(torch, problem["act"], compiled_cache, use_compile)
    result.update(time_torch_functions(  # the check compiles and loads the kernels
        torch, functions, tensors, lambda label, fn, s=sets[0], t=tensors[0]: peer_error(
            family, problem, label, fn, s, t), ROUNDS))
    del sets, tensors
    cupy.get_default_memory_pool().free_all_blocks()
    return result


# -- report ---------------------------------------------------------------------------------------


def summarize(doc: dict) -> dict:
    """Times, speedups over each peer (all in torch's graphs), % of the FP32 peak, targets."""
    w = doc.get("winner") or {}
    peers = doc.get("torch", {})
    ours = peers.get("autogen", {}).get("time_us")
    peak = doc.get("fp32_peak_tflop_per_s")
    shape = doc["problem"]["shape"]
    flops = 2 * shape["batch"] * shape["m"] * shape["n"] * shape["k"]
    out = {"tuned_us": w.get("time_us"), "autogen_us": ours, "cublas_batched_us": w.get("peer_time_us"),
           "pct_of_fp32_peak": round(100 * flops / (ours * 1e-6) / (peak * 1e12), 1) if ours and peak else None}
    targets = {}
    for label in ("eager", "bmm", "compile"):
        t = peers.get(label, {}).get("time_us")
        out[f"{label}_us"] = t
        out[f"{label}_speedup"] = round(t / ours, 3) if t and ours else None
        named = tuple(shape[d] for d in ("batch", "m", "n", "k")) in NAMED
        if named and out[f"{label}_speedup"] is not None:
            targets[f"vs_{label}>={TARGETS[label]}"] = out[f"{label}_speedup"] >= TARGETS[label]
    out["targets"] = targets
    return out


def label_of(doc: dict) -> str:
    s = doc["problem"]["shape"]
    return f"{s['act']} {s['batch']}x{s['m']}x{s['n']}x{s['k']}"


def row_cells(doc: dict) -> tuple:
    s = doc["summary"]
    missed = [k for k, ok in s["targets"].items() if not ok]
    return (label_of(doc), num(s["autogen_us"], ".1f"), num(s["pct_of_fp32_peak"], ".1f"), num(s["eager_us"], ".1f"),
            num(s["eager_speedup"], ".3f"), num(s["bmm_us"], ".1f"), num(s["bmm_speedup"], ".3f"),
            num(s["compile_us"], ".1f"), num(s["compile_speedup"], ".3f"), num(s["tuned_us"], ".1f"),
            num(s["cublas_batched_us"], ".1f"), ("ok" if not missed else "MISS " + ",".join(missed)) if s["targets"]
            else "-", (doc.get("winner") or {}).get("kernel", doc.get("no_winner", "-")))


HEADER = ("problem", "us", "%peak", "eager us", "x eager", "bmm us", "x bmm", "compile us", "x compile", "tuned us",
          "cuBLAS us", "targets", "kernel")


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from autogen.core.registry import get_family
    from autogen.runtime import dispatch

    db_url = args.db or f"sqlite:///{args.out / 'bench_gemm_bias_act.db'}"
    dispatch._default_dispatcher = dispatch.Dispatcher(db_url)  # autogen's calls serve this run's winners
    family = get_family("gemm_bias_act")
    acts = [a.strip() for a in args.acts.split(",") if a.strip()]
    shapes = parse_shapes(args.shapes)
    problems = [family.problem(**dict(zip(family.dims, shape)), act=act) for shape in shapes for act in acts]
    weights = [NAMED_WEIGHT if shape in NAMED else 1.0 for shape in shapes for _act in acts]
    compiled_cache: dict = {}
    rows = []
    started = time.monotonic()
    budget = Budget(total_s=args.budget, fixed_s=FIXED_S, at_least_s=2.0)
    for problem, _result, doc in tune_each(problems, {"trials": args.trials, "db_url": db_url}, budget,
                                           weights=weights, started=started):
        begun = time.monotonic()
        doc["torch"] = time_torch(problem, family, compiled_cache, not args.no_compile)
        doc["summary"] = summarize(doc)
        doc["bench_wall_s"] = {"tune": doc.pop("bench_wall_s"), "torch": round(time.monotonic() - begun, 1)}
        rows.append(doc)
        write_results(args.out, "gemm_bias_act", doc["gpu"], {"problems": rows})
        print(render_table([row_cells(doc)]), file=sys.stderr, flush=True)
    gpu = rows[0]["gpu"] if rows else "?"
    peak = rows[0].get("fp32_peak_tflop_per_s") if rows else None
    print(f"\n{gpu}, FP32 FMA peak {peak} TFLOP/s measured; TF32 off; us: autogen's call in torch's CUDA graphs, "
          f"cold inputs, medians; x: peer time over it; tuned us and cuBLAS us: the tuner's (CuPy graphs); total "
          f"{time.monotonic() - started:.0f} s")
    print(table(HEADER, map(row_cells, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
