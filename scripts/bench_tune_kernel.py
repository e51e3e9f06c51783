"""autogen.tune_kernel against Kernel Tuner 1.5's tune_kernel (its CuPy backend) on Kernel
Tuner's own examples (examples/kt_examples: vector_add, the tiled matmul), the same parameter
grid searched whole by both (brute force), on the same GPU in the same run: each tool's wall time
and best kernel time, and autogen's time (CUDA graphs, cold buffers) of Kernel Tuner's winner,
which autogen's exhaustive search measured too. Writes OUT/tune_kernel_<gpu>.json after each
example.

    PYTHONPATH=examples:$PWD python scripts/bench_tune_kernel.py OUT [--width 2048] [--size 10000000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import benchlib  # noqa: F401  (puts the checkout on sys.path)
from benchlib import table, write_results


def run_kernel_tuner(module, kernel_name: str, problem_size, args, answer, **extra) -> dict:
    """Kernel Tuner's tune_kernel on the example, its answers in the outputs' dtype."""
    import kernel_tuner

    answer = [a.astype(args[i].dtype) if a is not None else None for i, a in enumerate(answer)]
    started = time.perf_counter()
    results, env = kernel_tuner.tune_kernel(kernel_name, str(module.SOURCE), problem_size, args, module.TUNE_PARAMS,
                                            answer=answer, lang="cupy", strategy="brute_force", verbose=False,
                                            quiet=True, **extra)
    wall = time.perf_counter() - started
    valid = [r for r in results if isinstance(r.get("time"), float)]
    best = min(valid, key=lambda r: r["time"])
    return {"wall_s": round(wall, 2), "best_us": round(best["time"] * 1000, 3), "measured": len(valid),
            "best_params": {k: best[k] for k in module.TUNE_PARAMS}, "version": kernel_tuner.__version__,
            "device": env.get("device_name")}


def run_autogen(tune, db: str) -> dict:
    started = time.perf_counter()
    found = tune(db=db, progress=lambda _line: None)
    wall = time.perf_counter() - started
    ok = [r for r in found.results if r["status"] == "ok"]
    return {"wall_s": round(wall, 2), "best_us": found.env["best_time_us"], "best_params": found.best,
            "measured": len(found.results), "passed": len(ok), "device": found.env["device_name"],
            "results": {r["kernel_name"]: r["time_us"] for r in ok},
            "params": {r["kernel_name"]: {k: r[k] for k in found.best} for r in ok}}


def autogen_time_of(autogen_run: dict, params: dict) -> float | None:
    """autogen's measurement of the point Kernel Tuner chose (its search measured every point)."""
    for name, point in autogen_run["params"].items():
        if point == params:
            return autogen_run["results"][name]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", type=int, default=10_000_000, help="vector_add's n")
    parser.add_argument("--width", type=int, default=4096, help="matmul's WIDTH")
    options = parser.parse_args()
    from kt_examples import matmul, vector_add

    doc, rows = {"examples": {}}, []
    with tempfile.TemporaryDirectory() as folder:
        db = f"sqlite:///{folder}/bench.db"
        cases = {
            "vector_add": (lambda **o: vector_add.tune(options.size, **o),
                           lambda: run_kernel_tuner(vector_add, "vector_add", options.size,
                                                    *vector_add.arguments(options.size))),
            "matmul": (lambda **o: matmul.tune(options.width, **o),
                       lambda: run_kernel_tuner(matmul, "matmul_kernel", (options.width, options.width),
                                                *matmul.arguments(options.width), grid_div_x=matmul.GRID_DIV_X,
                                                grid_div_y=matmul.GRID_DIV_Y, restrictions=matmul.RESTRICTIONS,
                                                compiler_options=[f"-DWIDTH={options.width}"], atol=matmul.ATOL)),
        }
        gpu = None
        for example, (ours, theirs) in cases.items():
            mine = run_autogen(ours, db)
            kt = theirs()
            gpu = mine["device"]
            kt["autogen_time_of_kt_best_us"] = autogen_time_of(mine, kt["best_params"])
            doc["examples"][example] = {"autogen": {k: v for k, v in mine.items() if k not in ("results", "params")},
                                        "kernel_tuner": kt}
            rows.append((example, mine["wall_s"], kt["wall_s"], mine["best_us"], kt["best_us"],
                         kt["autogen_time_of_kt_best_us"], mine["best_params"], kt["best_params"]))
            write_results(options.out, "tune_kernel", gpu, doc)
    print(table(("example", "autogen wall s", "KT wall s", "autogen best us", "KT best us (its timer)",
                 "KT's best, autogen's timer us", "autogen best", "KT best"), rows))


if __name__ == "__main__":
    main()
