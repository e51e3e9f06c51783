"""A/B of chosen variants of one family on the GPU: each validated on fresh inputs, then all re-timed
interleaved (round after round, so drift hits all alike) in one process with the peer timed on the
same cold input sets. The evidence behind a template change, before the search is trusted with it.

  python3 scripts/ab_variants.py hgemv --dtype float16 --dims m=4096,n=4096,batch=1 \\
      --base '{"threads_per_row": 256, "pack_width": 8, "warps_per_block": 8, "rows_per_group": 2}' \\
      --vary load_schedule=chunk,step --vary tail=checked,peeled --out DIR

Every --base (the family's default where a parameter is not given) crossed with every --vary choice
is one variant; each --dims is one problem. Writes DIR/ab_<family>_<gpu>.json and prints a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

from benchlib import num, table, write_results

ROUNDS = 15  # interleaved replays per variant


def parse_dims(text: str) -> dict:
    """m=4096,n=4096 -> {"m": 4096, "n": 4096}; values that are not integers stay strings."""
    dims = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        dims[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    return dims


def variants(family, bases: list[dict], varied: list[tuple[str, list[str]]]) -> list:
    """Each base crossed with every combination of the varied choices, checked against the space;
    a combination the space rules out is skipped with its reason printed."""
    configs = []
    names = [name for name, _ in varied]
    for base in bases or [{}]:
        for combo in itertools.product(*(choices for _, choices in varied)):
            params = {**family.default_params, **base, **dict(zip(names, combo))}
            params = {k: (int(v) if isinstance(v, str) and v.isdigit() else v) for k, v in params.items()}
            problems = family.space.violations(params)
            if problems:
                print(f"skipped {params}: {'; '.join(problems)}")
                continue
            config = family.space.check(params)
            if config not in configs:
                configs.append(config)
    return configs


def named_variants(family, problem, configs) -> dict:
    """{kernel name: config}, named with the problem's traits (scan's accumulator type, ...) as the
    tuner names them."""
    return {family.kernel_name(problem.dtype, c, problem.traits): c for c in configs}


def ab_problem(family, problem, configs, rounds: int, probe=None) -> dict:
    """Validate, then re-time every config interleaved, and time the peer, for one problem; with
    `probe` (evaluator -> dict), its figures timed on the same input sets join the row."""
    from autogen.gpu import roofline
    from autogen.gpu.compile import compile_many
    from autogen.gpu.device import device_identity
    from autogen.core.render import render
    from autogen.gpu.evaluator import Evaluator, WorkSpec

    evaluator = Evaluator(WorkSpec.of(problem))
    names = named_variants(family, problem, configs)
    sources = {name: render(family, problem.dtype, c, traits=problem.traits) for name, c in names.items()}
    cubins = compile_many(sources, device_identity().arch)
    row = {"problem": str(problem), "failed": {}, "medians_us": {}, "spreads_us": {}}
    candidates = []
    for name, config in names.items():
        cubin = cubins[name]
        if not isinstance(cubin, bytes):
            row["failed"][name] = f"compile: {cubin}"
            continue
        check = evaluator.check(name, cubin, config.as_dict())
        if not check.ok:
            row["failed"][name] = f"validation: {check.reason}"
            continue
        candidates.append((name, cubin, config.as_dict()))
    for name, samples in evaluator.retime(candidates, rounds).items():
        row["medians_us"][name] = round(statistics.median(samples), 3)
        row["spreads_us"][name] = round(max(samples) - min(samples), 3)
    peer = evaluator.time_peer()
    if peer:
        row["peer"], row["peer_us"] = peer[0], round(statistics.median(peer[1]), 3)
    # The roofline of the family's bound (bytes over the copy bandwidth, or flops over the FP32 peak).
    ceilings = evaluator.ceilings()
    floor = roofline.floor_us(family, problem, family.bytes_moved(problem, family.timing_case(problem)),
                              ceilings.copy_gbs, ceilings.fp32_tflops)
    row["copy_gbs"], row["floor_us"] = round(ceilings.copy_gbs, 1), floor and round(floor, 3)
    row["gpu"] = evaluator.device.name
    if probe is not None:
        row.update(probe(evaluator))
    return row


def variant_rows(row: dict) -> list[tuple]:
    """Table rows of one problem: the variants fastest first, then those that failed."""
    timed = [(name, f"{us:.3f}", f"{row['spreads_us'][name] / 2:.3f}",
              num(100 * row["floor_us"] / us if row["floor_us"] else None, ".1f"),
              num(row["peer_us"] / us if "peer_us" in row else None, ".2f"))
             for name, us in sorted(row["medians_us"].items(), key=lambda item: item[1])]
    return timed + [(name, f"FAILED {reason}") for name, reason in row["failed"].items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family")
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--dims", action="append", required=True, help="one problem, e.g. m=4096,n=4096,batch=1")
    parser.add_argument("--base", action="append", default=[], help="JSON params (default: the family's default)")
    parser.add_argument("--vary", action="append", default=[], help="PARAM=CHOICE,CHOICE,...")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from autogen.core.registry import get_family

    family = get_family(args.family)
    varied = [(name, choices.split(",")) for name, _, choices in (v.partition("=") for v in args.vary)]
    configs = variants(family, [json.loads(b) for b in args.base], varied)
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    for dims in args.dims:
        problem = family.problem(args.dtype, **parse_dims(dims))
        row = ab_problem(family, problem, configs, args.rounds)
        rows.append(row)
        write_results(args.out, f"ab_{family.name}", row["gpu"], {"rows": rows})
        print(f"\n{row['problem']} on {row['gpu']}: copy {row['copy_gbs']} GB/s, floor {row['floor_us']} us, "
              f"{row.get('peer', 'no peer')} {row.get('peer_us', '-')} us")
        print(table(("variant", "us", "+-", "% floor", "x peer"), variant_rows(row)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
