"""One tuner process for tests/distributed/test_distributed.py: the replay test aid standing in for a GPU.

    python tests/support/distributed_worker.py DB_URL TRIALS DELAY_S LEASE_S SEED OUT.json [GPUS [MEET_DIR PARTIES]]

Tunes sgemv 8192 x 16 from the H100 recording, each evaluation taking DELAY_S, and writes what
it evaluated and its counts to OUT.json (a process killed with SIGKILL writes nothing). With
GPUS ("0,1"), it tunes on those "GPUs" as `--gpus` does (autogen.distributed.multi_gpu: helper processes).
With MEET_DIR, its evaluators start measuring together with the others of PARTIES evaluators
(the replay aid's Meeting: other worker processes, or its own helper processes).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from autogen.core.registry import get_family  # noqa: E402
from autogen.distributed.multi_gpu import tune_problems  # noqa: E402
from autogen.testing.replay import ReplayBackend, load  # noqa: E402
from autogen.search.tuner import TuneOptions  # noqa: E402

ASSET = Path(__file__).parent.parent / "assets" / "replay_sgemv_8192x16.json"
PROBLEM = get_family("sgemv").problem(m=8192, n=16)


def _timestamped(line: str) -> None:
    print(f"{time.time():.3f} {line}", file=sys.stderr, flush=True)


def main(url: str, trials: str, delay_s: str, lease_s: str, seed: str, out: str, gpus: str = "",
         meet_dir: str = "", parties: str = "0") -> None:
    made: list = []
    options = TuneOptions(db_url=url, trials=int(trials), workers=1, lease_s=float(lease_s), seed=int(seed),
                          gpus=tuple(int(g) for g in gpus.split(",")) if gpus else None)
    started = time.time()
    factory = ReplayBackend.factory(load(ASSET), delay_s=float(delay_s), made=made, meet_in=meet_dir or None,
                                    meet={PROBLEM: int(parties)} if meet_dir else None)
    (result,) = tune_problems([PROBLEM], options, _timestamped, backend_factory=factory)
    Path(out).write_text(json.dumps({
        "evaluated": made[0].evaluator.evaluated, "measured": result.measured, "failed": result.failed,
        "taken_over": result.taken_over, "winner": result.winner.trial.kernel_name if result.winner else None,
        "wall_s": time.time() - started,
    }))


if __name__ == "__main__":
    # Ctrl-C as on a terminal: a test suite started in the background by a non-interactive shell
    # ignores SIGINT, and its children would inherit that (test_ctrl_c_ends_the_helper_processes).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main(*sys.argv[1:])
