"""How a search starts, on the CPU: tune one problem on the replay aid with as many compile processes
as a GPU machine gives, and count the asks the sampler spends before and around its first results.

    python scripts/sim_search_start.py [--problem 4096x4096x1] [--seeds 0-7] [--workers 8] [--delay-ms 8]

The problems are fp16 hgemv: 4096 x 4096 at one vector (the default), whose space holds about 1.1
million combinations of which about 6,300 are measured for that shape, and 3000 x 4099 at four
vectors (rows off the 16-byte boundary). Each recording is synthetic (made once, in the system's
temporary folder): every measured point "timed" at 9.5 us times 1.12 for each step a parameter's
choice lies from a winner an H100 or H200 found (4096 x 4096: session 27's on an H200, call F;
3000 x 4099 x 4: session 30's bounded rows in flight on an H100), with 2% of noise from a hash of
its name, so that TPE has a landscape to climb. Prints, per seed, the asks rejected, reused, their
seconds, and the best point found (docs/internals.md, "The search").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_scale_out import RECORDING, make_problem  # noqa: E402

# (the problem, the best point of its landscape)
LANDSCAPES = {
    "4096x4096x1": ({"family": "hgemv", "dtype": "float16", "dims": {"m": 4096, "n": 4096, "batch": 1}},
                    {"a_buffers": 1, "batch_tile": 1, "load_schedule": "chunk", "min_blocks": 1, "pack_width": 8,
                     "reduce": "shfl", "row_align": "scalar", "rows_per_group": 2, "split_k": 1, "tail": "peeled",
                     "threads_per_row": 256, "unroll": 2, "warps_per_block": 8, "x_path": "ldg"}),
    "3000x4099x4": ({"family": "hgemv", "dtype": "float16", "dims": {"m": 3000, "n": 4099, "batch": 4}},
                    {"a_buffers": 1, "batch_tile": 4, "load_schedule": "chunk", "min_blocks": 4, "pack_width": 4,
                     "reduce": "shfl", "row_align": "peeled", "rows_per_group": 4, "split_k": 1, "tail": "checked",
                     "threads_per_row": 128, "unroll": 1, "warps_per_block": 8, "x_path": "ldg"}),
}


def landscape_recording(path: Path, spec: dict, winner: dict) -> Path:
    """The synthetic recording (see the module's docstring), written to ``path`` once."""
    if path.exists():
        return path
    from autogen.core.registry import get_family
    from autogen.testing.replay import load

    family, problem = get_family(spec["family"]), make_problem(spec)
    choices = {p.name: list(p.choices) for p in family.space.params}
    trials = {}
    for config in family.space.enumerate():
        if family.reject_reason(problem, config):
            continue
        steps = sum(abs(choices[k].index(v) - choices[k].index(winner[k])) for k, v in config.as_dict().items())
        name = family.kernel_name(problem.dtype, config, problem.traits)
        us = 9.5 * 1.12 ** steps * (1 + 0.02 * ((zlib.crc32(name.encode()) % 1000) / 1000 - 0.5))
        trials[name] = {"status": "ok", "reason": "", "samples_us": [us * (1 + 0.001 * i) for i in range(7)], "error": 0.0}
    base = load(RECORDING)
    path.write_text(json.dumps({**base, "problem": {"family": problem.family, "dtype": problem.dtype,
                                                    "shape_key": problem.shape_key}, "trials": trials}))
    return path


def run(seed: int, workers: int, delay_s: float, recording: Path, folder: Path, spec: dict) -> dict:
    from autogen.search.tuner import Tuner, TuneOptions
    from autogen.testing.replay import ReplayBackend, load

    options = TuneOptions(db_url=f"sqlite:///{folder / f'seed{seed}.db'}", trials=60, workers=workers, seed=seed,
                          retime_rounds=3)
    began = time.perf_counter()
    result = Tuner(make_problem(spec), options, progress=lambda line: None,
                   backend_factory=ReplayBackend.factory(load(recording), delay_s=delay_s)).run()
    return {"seed": seed, "wall_s": round(time.perf_counter() - began, 2), "measured": result.measured,
            "rejected": result.rejected, "reused": result.reused, "ask_s": result.phases_s.get("search_ask"),
            "best_us": round(result.winner.trial.time_us, 3) if result.winner else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", choices=sorted(LANDSCAPES), default="4096x4096x1")
    parser.add_argument("--seeds", default="0-7", help="a range, e.g. 0-7")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--delay-ms", type=float, default=8.0, help="an evaluation's time on the GPU thread")
    args = parser.parse_args()
    low, _, high = args.seeds.partition("-")
    spec, winner = LANDSCAPES[args.problem]
    recording = landscape_recording(Path(tempfile.gettempdir()) / f"autogen_sim_search_start_{args.problem}.json",
                                    spec, winner)
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(int(low), int(high or low) + 1):
            print(json.dumps(run(seed, args.workers, args.delay_ms / 1000, recording, Path(folder), spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
