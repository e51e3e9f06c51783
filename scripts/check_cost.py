"""What one variant's check costs on the host (NumPy) and on the device (CuPy), per problem size:
the data behind a family's `host_check_bytes` (problems up to it are checked on the host).

    python scripts/check_cost.py --out DIR [--checks 9]

In one GPU worker's Evaluator (as a tune has it), after its rehearsal (Evaluator.prepare: the
device checks' CuPy kernels compiled), the family's default variant is validated --checks times on
the device and as many on the host, interleaved; each figure is the median wall time of a check.
Writes DIR/check_cost_<gpu>.json and prints the table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchlib import table, write_results

# (family, dtype, dims): sgemv's and hgemv's decode shapes from 64 KiB to 4 MiB, and softmax rows.
PROBLEMS = [
    ("sgemv", "float32", {"m": 1024, "n": 16}),
    ("sgemv", "float32", {"m": 4096, "n": 16}),
    ("sgemv", "float32", {"m": 4096, "n": 32}),
    ("sgemv", "float32", {"m": 16384, "n": 16}),
    ("sgemv", "float32", {"m": 16384, "n": 32}),
    ("hgemv", "float16", {"m": 1024, "n": 64, "batch": 1}),
    ("hgemv", "float16", {"m": 4096, "n": 128, "batch": 1}),
    ("softmax", "float32", {"rows": 64, "cols": 1024}),
    ("softmax", "float32", {"rows": 256, "cols": 1024}),
]


def check_costs(family_name: str, dtype: str, dims: dict, checks: int) -> dict:
    import numpy as np

    from autogen.core.registry import get_family
    from autogen.core.render import render
    from autogen.gpu.compile import compile_cubin
    from autogen.gpu.evaluator import Evaluator, WorkSpec
    from autogen.gpu.measure import validate

    family = get_family(family_name)
    problem = family.problem(dtype, **dims)
    evaluator = Evaluator(WorkSpec.of(problem))
    evaluator.prepare()
    config = family.default_config(problem)
    name = family.kernel_name(dtype, config, problem.traits)
    cubin = compile_cubin(render(family, dtype, config, traits=problem.traits), evaluator.device.arch)
    launch = evaluator._launcher(name, cubin, config.as_dict())
    device_rng, host_rng = evaluator.cupy.random.default_rng(1), np.random.default_rng(1)
    family.host_check_bytes = 1 << 62  # this process's family object: every size on the host when asked
    ways = {"device": lambda: validate(family, problem, launch, evaluator.cupy, device_rng),
            "host": lambda: validate(family, problem, launch, evaluator.cupy, device_rng, host_rng)}
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(checks):
        for way, check in ways.items():
            began = time.perf_counter()
            assert check().ok, f"{family_name} {dims}: the default variant failed its {way} check"
            seconds[way].append(time.perf_counter() - began)
    return {"family": family_name, "dtype": dtype, "dims": dims, "bytes": family.bytes_moved(problem, family.timing_case(problem)),
            **{f"{way}_ms": round(1000 * statistics.median(values), 3) for way, values in seconds.items()},
            "gpu": evaluator.device.name}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checks", type=int, default=9)
    args = parser.parse_args()
    rows = [check_costs(*problem, args.checks) for problem in PROBLEMS]
    print(table(["family", "dims", "bytes", "device ms", "host ms"],
                [[r["family"], str(r["dims"]), r["bytes"], r["device_ms"], r["host_ms"]] for r in rows]))
    write_results(args.out, "check_cost", rows[0]["gpu"], {"rows": rows})


if __name__ == "__main__":
    main()
