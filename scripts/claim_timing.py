"""The time of one claim_many call against the trials its problem holds (issue 38, point 3).

    python scripts/claim_timing.py --db postgresql+psycopg://postgres@127.0.0.1:PORT/postgres --trials 100,6400

For each count N: a new database (a new SQLite file, or a new PostgreSQL database on the server of
--db, dropped after), one problem filled with N trials as workers store them (claimed in batches
of 8, each completed: a claim row and a trial row per variant, stored as they come, nothing
vacuumed), each completion timed, then --calls claims of one new variant each, timed one by one as
the client sees them (median and highest). On PostgreSQL the budget's read is shown with EXPLAIN ANALYZE (the
statement the claim function runs under the lock), before and after a VACUUM of the two
tables. The figures are of this machine's CPU, never of a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from sim_scale_out import Databases  # noqa: E402
from tuning_db import DeviceIdentity, TrialRecord, TuningDB  # noqa: E402

DEVICE = DeviceIdentity("Simulated GPU", "9.0", 132, 52428800, 13000, 13000, "13.0")
SHAPE = "m=1024,n=1024,k=1024"
BATCH = 8


def trial(kernel: str) -> TrialRecord:
    return TrialRecord(family="sgemm", dtype="float32", shape_key=SHAPE, kernel_name=kernel, params={"k": kernel},
                       status="ok", time_us=10.0, samples_us=(10.0,), spread_us=0.0, error=0.0,
                       source_hash="h-" + kernel, compile_options="")


def fill(db: TuningDB, count: int) -> list[float]:
    """``count`` variants claimed in batches and completed, as workers store them; the
    milliseconds of each completion (complete_claim)."""
    times = []
    for start in range(0, count, BATCH):
        names = [f"k{i}" for i in range(start, min(start + BATCH, count))]
        db.claim_many(DEVICE, [(trial(name), "v" + name) for name in names], "filler", 60.0, budget=10**9)
        for name in names:
            begun = time.perf_counter()
            db.complete_claim(DEVICE, trial(name), "v" + name, "filler")
            times.append((time.perf_counter() - begun) * 1e3)
    return times


def time_claims(db: TuningDB, calls: int) -> list[float]:
    """Milliseconds of each of ``calls`` claims of one new variant (left running)."""
    times = []
    for i in range(calls):
        wanted = [(trial(f"new{i}"), f"vnew{i}")]
        start = time.perf_counter()
        db.claim_many(DEVICE, wanted, "timer", 60.0, budget=10**9)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def explain_budget_read(url: str) -> str:
    """EXPLAIN ANALYZE of the launched count as the head claim function reads it."""
    from sqlalchemy import create_engine, text

    from tuning_db.migrations.functions import LAUNCHED

    problem = {"p_gpu_id": 1, "p_family": "sgemm", "p_dtype": "float32", "p_shape_key": SHAPE, "p_cache_mode": "cold"}
    statement = LAUNCHED
    for name in problem:
        statement = statement.replace(name, f":{name}")
    engine = create_engine(url)
    with engine.connect() as connection:
        plan = connection.execute(text("EXPLAIN (ANALYZE, BUFFERS) SELECT " + statement), problem).scalars().all()
    engine.dispose()
    return "\n".join(plan)


def vacuum(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text("VACUUM ANALYZE autogen_trials, autogen_claims"))
    engine.dispose()


def measure(dbs: Databases, count: int, calls: int) -> None:
    url = dbs.new()
    try:
        with TuningDB(url) as db:
            completions = fill(db, count)
            print(f"{count} trials stored: complete_claim {statistics.median(completions):.2f} ms median")
            postgres = url.startswith("postgresql")
            if postgres:
                print(explain_budget_read(url))
            times = time_claims(db, calls)
            print(f"{count} trials: claim_many {statistics.median(times):.2f} ms median, {max(times):.2f} ms highest "
                  f"({calls} calls)")
            if postgres:
                vacuum(url)
                print(explain_budget_read(url))
                times = time_claims(db, calls)
                print(f"{count} trials, vacuumed: claim_many {statistics.median(times):.2f} ms median, "
                      f"{max(times):.2f} ms highest")
    finally:
        dbs.drop(url)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default="sqlite", help="a PostgreSQL server URL, or 'sqlite' (new files)")
    parser.add_argument("--trials", default="100,6400", help="the problem's stored trials, comma-separated")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        dbs = Databases(args.db, Path(folder))
        for count in (int(n) for n in args.trials.split(",")):
            measure(dbs, count, args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
