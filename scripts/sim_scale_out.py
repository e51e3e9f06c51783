"""Tuning that scales out, simulated on a machine without GPUs: worker processes on one database,
the replay test aid (autogen.testing.replay) standing in for each GPU with a fixed sleep per
evaluation. Writes one JSON document (throughput, efficiency, database round trips and rows
written per trial, per-phase seconds, duplicates) and prints the table.

    python scripts/sim_scale_out.py scale --db URL --workers 8,16,32,64 --eval-ms 50,500 --out F.json
            [--problem sgemm:float32:m=1024,n=1024,k=1024]
    python scripts/sim_scale_out.py cases --db URL --out F.json [--eval-ms 30]

scale: N tuner processes (`autogen tune` as on N machines, one GPU each) tune one problem
       together; each sampler is random (TPE's fit would make the simulator CPU-bound before the
       database is: state how busy the CPU was, `cpu_busy`, next to every figure). Throughput
       counts the evaluations from the first one's start to the last one's end
       (`search_span_s`); `stored_span_s` runs from the first stored trial to the last, which
       includes the owner's re-timing of its finalists after the search (their rows are
       stored again).
cases: the three runs of issue 38 on simulated GPUs: 8 shapes x 60 trials on 1 vs 2 GPUs,
       1 shape x 240 trials on 1 vs 2 GPUs, and 1 vs 2 processes sharing the database (TPE).

--problem (scale): the problem the workers tune, FAMILY:DTYPE:DIM=V,... (default sgemv 4096 x 16,
       whose 728 valid points 32 workers of 20 trials nearly exhaust). A problem other than the
       recording's gets a synthetic recording: every valid point of its space "measured" at a time
       made up from its name's hash, so that the search has thousands of points to claim. Only
       the throughput means anything then; the times are not a GPU's.

Every run gets a database of its own (a new SQLite file, or a new PostgreSQL database on the
server of --db). The figures are of this simulation on this machine, never of a GPU.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RECORDING = ROOT / "tests" / "assets" / "replay_sgemv_8192x16.json"
SHAPES = [(m, n) for m in (4096, 16384) for n in (16, 32, 128, 1024)]
DEFAULT_PROBLEM = "sgemv:float32:m=4096,n=16"


def sgemv_spec(m: int, n: int) -> dict:
    return {"family": "sgemv", "dtype": "float32", "dims": {"m": m, "n": n}}


def parse_problem(text: str) -> dict:
    """FAMILY:DTYPE:DIM=V,... as a problem spec (family, dtype, dims)."""
    family, dtype, dims = text.split(":", 2)
    return {"family": family, "dtype": dtype,
            "dims": {k: int(v) if v.lstrip("-").isdigit() else v for k, v in (d.split("=", 1) for d in dims.split(","))}}


def make_problem(spec: dict):
    from autogen.core.registry import get_family

    return get_family(spec["family"]).problem(spec["dtype"], **spec["dims"])


def synthetic_recording(spec: dict, path: Path) -> Path:
    """A recording for ``spec``'s problem on the real recording's device: every point of the
    space the search would measure (valid, not pruned for the shape), "measured" at 5-25 us from a
    hash of its name. Written to ``path``; returns it."""
    import zlib

    from autogen.core.registry import get_family
    from autogen.testing.replay import load

    base = load(RECORDING)
    problem = make_problem(spec)
    family = get_family(spec["family"])
    trials = {}
    for config in family.space.enumerate():
        if family.reject_reason(problem, config):
            continue
        name = family.kernel_name(problem.dtype, config, problem.traits)
        us = 5.0 + 20.0 * (zlib.crc32(name.encode()) % 10_000) / 10_000
        trials[name] = {"status": "ok", "reason": "", "samples_us": [us * (1 + 0.001 * i) for i in range(7)],
                        "error": 0.0}
    path.write_text(json.dumps({**base, "problem": {"family": problem.family, "dtype": problem.dtype,
                                                    "shape_key": problem.shape_key}, "trials": trials}))
    return path


# -- one worker process ----------------------------------------------------------------------------


def worker(args) -> None:
    """A tuner process: tunes ``args.problems`` on the replay aid, writes its report to args.report."""
    from autogen.distributed.multi_gpu import tune_problems
    from autogen.distributed.order import in_start_order
    from autogen.search import dbstats
    from autogen.search.tuner import TuneOptions
    from autogen.testing.replay import ReplayBackend, load

    dbstats.install()
    # As `autogen tune` takes them: from this process's place in the list round.
    problems = in_start_order([make_problem(spec) for spec in json.loads(args.problems)])
    gpus = tuple(range(args.gpus)) if args.gpus > 1 else None
    options = TuneOptions(db_url=args.db, trials=args.trials, workers=1, sampler=args.sampler, seed=args.seed,
                          lease_s=60.0, gpus=gpus, retime_rounds=3)
    made: list = []
    meet = {p: args.parties for p in problems} if args.parties > 1 else None
    factory = ReplayBackend.factory(load(Path(args.recording)), delay_s=args.eval_ms / 1000, made=made,
                                    meet_in=args.meet or None, meet=meet, log_to=args.evaluations)
    cpu0, wall0 = os.times(), time.monotonic()
    results = tune_problems(problems, options, lambda _line: None, backend_factory=factory)
    wall = time.monotonic() - wall0
    cpu1 = os.times()
    Path(args.report).write_text(json.dumps({
        "wall_s": wall, "cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
        "evaluated": [name for b in made for name in b.evaluator.evaluated],
        "met_after_s": [b.evaluator.met_after_s for b in made],  # in the first evaluation's time
        "cpu_at": [c for b in made for c in b.evaluator.cpu_at],
        "db": dbstats.snapshot().__dict__,
        "problems": [{"shape": p.shape_key, "measured": r.measured + r.failed, "phases_s": r.phases_s,
                      "winner": r.winner.trial.kernel_name if r.winner else None,
                      "winner_us": r.winner.trial.time_us if r.winner else None}
                     for p, r in zip(problems, results)],
    }))


# -- databases --------------------------------------------------------------------------------------


class Databases:
    """A fresh database per run: a SQLite file under ``folder``, or a PostgreSQL database on the
    server of ``server`` (dropped after the run)."""

    def __init__(self, server: str, folder: Path):
        self.server, self.folder = server, folder

    def new(self) -> str:
        if not self.server.startswith("postgresql"):
            return f"sqlite:///{self.folder / (uuid.uuid4().hex[:8] + '.db')}"
        from sqlalchemy import create_engine, text

        name = "autogen_sim_" + uuid.uuid4().hex[:10]
        admin = create_engine(self.server, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        return self.server.rsplit("/", 1)[0] + "/" + name

    def drop(self, url: str) -> None:
        if not url.startswith("postgresql"):
            return
        from sqlalchemy import create_engine, text

        admin = create_engine(self.server, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE "{url.rsplit("/", 1)[1]}" WITH (FORCE)'))
        admin.dispose()


# -- runs -------------------------------------------------------------------------------------------


def run(url: str, processes: int, problems: list[dict], trials: int, eval_ms: float, sampler: str, gpus: int = 1,
        folder: Path | None = None, timeout_s: float = 900) -> dict:
    """``processes`` tuner processes on ``url`` tuning ``problems`` (specs: family, dtype, dims);
    their reports and the run's figures."""
    from tuning_db import upgrade

    upgrade(url)  # as `autogen db upgrade` would, once
    folder = Path(tempfile.mkdtemp(prefix="autogen-sim-", dir=folder))
    recording = RECORDING
    if any(spec["family"] != "sgemv" for spec in problems):  # the recording is of sgemv
        if len(problems) != 1:
            raise SystemExit("a synthetic recording is made for one problem")
        # Made once per problem and invocation (enumerating a large space takes seconds).
        made = folder.parent / ("recording-" + uuid.uuid5(uuid.NAMESPACE_OID, json.dumps(problems[0], sort_keys=True)).hex + ".json")
        recording = made if made.exists() else synthetic_recording(problems[0], made)
    # One problem: every evaluator (process or GPU) meets at its first evaluation, so that one
    # that starts late does not find the budget spent. Several: processes start on different
    # problems (autogen.distributed.order), and a meeting on each would hold each process until
    # the other reached that problem (up to MEET_TIMEOUT_S a problem).
    meet = folder / "meet"
    reports = [folder / f"w{i}.json" for i in range(processes)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    load = LoadWatch()
    cpu0, wall0 = os.times(), time.monotonic()
    children = [subprocess.Popen([sys.executable, __file__, "worker", "--db", url, "--problems", json.dumps(problems),
                                  "--recording", str(recording),
                                  "--trials", str(trials), "--eval-ms", str(eval_ms), "--sampler", sampler,
                                  "--seed", str(i), "--gpus", str(gpus), "--report", str(report),
                                  "--meet", str(meet), "--parties", str(processes * gpus if len(problems) == 1 else 1),
                                  "--evaluations", str(folder / "evaluations.log")],
                                 env=env, stdout=subprocess.DEVNULL, stderr=open(report.with_suffix(".log"), "w"))
                for i, report in enumerate(reports)]
    deadline = time.monotonic() + timeout_s
    for child in children:
        child.wait(max(1, deadline - time.monotonic()))
    wall = time.monotonic() - wall0
    cpu1 = os.times()
    load.stop()
    failed = [r.with_suffix(".log").read_text()[-1500:] for c, r in zip(children, reports) if c.returncode != 0]
    if failed:
        raise SystemExit(f"{len(failed)} worker(s) failed; the first's log ends:\n{failed[0]}")
    docs = [json.loads(r.read_text()) for r in reports]
    logged = [line.split() for line in (folder / "evaluations.log").read_text().splitlines()]
    evaluations = [f"{mark} {kernel}" for mark, kernel, *_ in logged]
    figures = summarise(url, docs, wall, (cpu1.children_user - cpu0.children_user)
                        + (cpu1.children_system - cpu0.children_system), problems, trials, evaluations, recording)
    figures.update(load.figures())
    # Each evaluating process (tuner or helper): its first and last evaluation and how many, in
    # seconds from the run's first evaluation: who started late, who ended early.
    first = min((float(t) for _m, _k, _pid, t in logged), default=0.0)
    by_pid = collections.defaultdict(list)
    for _mark, _kernel, pid, t in logged:
        by_pid[pid].append(float(t) - first)
    figures["evaluators"] = [{"first_s": round(min(ts), 2), "last_s": round(max(ts), 2), "evaluations": len(ts)}
                             for ts in sorted(by_pid.values(), key=min)]
    # The search's span: from the first evaluation's start to the last one's end.
    span = max(float(t) for *_rest, t in logged) + eval_ms / 1000 - first if logged else None
    figures["search_span_s"] = round(span, 2) if span else None
    figures["trials_per_s"] = round(len(logged) / span, 2) if span else None
    stamps = figures.pop("_stored_at")  # epoch seconds of every stored trial, in order
    # The run's throughput over time: a slow start or a long tail, or a steady rate below the ideal.
    figures["stored_per_half_s"] = [sum(1 for t in stamps if stamps[0] + i / 2 <= t < stamps[0] + (i + 1) / 2)
                                    for i in range(int(2 * (stamps[-1] - stamps[0])) + 1)] if stamps else []
    window = load.window(stamps[0], stamps[-1]) if len(stamps) > 1 else None
    if window is not None:  # the samples taken within the search's span
        (t0, busy0, total0, server0), (t1, busy1, total1, server1) = window
        stored = sum(1 for t in stamps if t0 <= t <= t1)
        figures["machine_cpu_busy_in_search"] = round((busy1 - busy0) / max(1, total1 - total0), 2)
        # The server's steady CPU per trial: within the span, without the start-up.
        figures["server_search_cpu_ms_per_trial"] = round(1000 * (server1 - server0) / max(1, stored), 1)
    if figures["stored"]:
        figures["server_cpu_ms_per_trial"] = round(1000 * load.server_cpu_s / figures["stored"], 1)
    return figures


class LoadWatch:
    """The machine's load average (1 min) before a run and, sampled every second, during it: the
    machine is shared, and the figures mean little without it."""

    def __init__(self):
        import threading

        self.before = os.getloadavg()[0]
        self._busy0 = _machine_busy()
        self.samples: list[float] = []
        self.busy: list[tuple[float, int, int, float]] = []  # (time.time(), busy, total jiffies, server CPU s)
        self._server0 = _server_cpu_s()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(0.25):
            self.busy.append((time.time(), *_machine_busy(), _server_cpu_s()))
            tick += 1
            if tick % 4 == 0:
                self.samples.append(os.getloadavg()[0])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        (busy0, total0), (busy1, total1) = self._busy0, _machine_busy()
        self.machine_busy = (busy1 - busy0) / max(1, total1 - total0)
        time.sleep(0.5)  # the workers' server processes exit and are reaped
        self.server_cpu_s = _server_cpu_s() - self._server0

    def window(self, start: float, end: float) -> tuple[tuple, tuple] | None:
        """The first and the last sample (time, busy and total jiffies, server CPU s) taken
        between two times; None with fewer than two."""
        inside = [b for b in self.busy if start <= b[0] <= end]
        return (inside[0], inside[-1]) if len(inside) >= 2 else None

    def figures(self) -> dict:
        return {"load_before": round(self.before, 2),
                "load_during_max": round(max(self.samples, default=self.before), 2),
                "machine_cpu_busy": round(self.machine_busy, 2), "server_cpu_s": round(self.server_cpu_s, 2)}


def _server_cpu_s() -> float:
    """CPU seconds of the local PostgreSQL server so far: its postmaster's own and its reaped
    children's, plus its live children's (0 where none runs here)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in Path("/proc").iterdir():
        try:
            text = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if name.startswith("postgres"):
            stats[int(entry.name)] = (int(rest[1]), [int(x) for x in rest[11:15]])  # ppid; utime stime cutime cstime
    roots = [pid for pid, (ppid, _t) in stats.items() if ppid not in stats]
    total = 0
    for pid, (ppid, times) in stats.items():
        total += sum(times) if pid in roots else times[0] + times[1]
    return total / tick


def _machine_busy() -> tuple[int, int]:
    """All cores' busy and total jiffies so far (/proc/stat): every process's, other sessions' too."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def summarise(url: str, docs: list[dict], wall: float, cpu_s: float, problems: list[dict], trials: int,
              evaluations: list[str], recording: Path) -> dict:
    """The run's figures; ``evaluations``: every evaluation of every process (helper processes'
    included), a line "problem kernel" each."""
    from tuning_db import TuningDB
    from autogen.testing.replay import ReplayBackend, load

    db = TuningDB(url)
    device = ReplayBackend(load(recording)).device
    stored = []
    for problem in map(make_problem, problems):
        stored += [t for t in db.trials(device, problem.family, problem.dtype, problem.shape_key) if t.status != "rejected"]
    created = sorted(t.created_at for t in stored)
    db.close()
    search_s = _span(created)
    counted = collections.Counter(evaluations)  # per problem and kernel
    phases = collections.Counter()
    for d in docs:
        for p in d["problems"]:
            phases.update({k: v for k, v in p["phases_s"].items() if isinstance(v, (int, float))})
    db_totals = collections.Counter()
    for d in docs:
        db_totals.update(d["db"])
    n = max(1, len(stored))
    return {"wall_s": round(wall, 2), "stored": len(stored), "budget": trials * len(problems),
            "evaluations": len(evaluations), "duplicates": sum(c - 1 for c in counted.values() if c > 1),
            "stored_span_s": round(search_s, 2), "stored_per_s": round(len(stored) / search_s, 2) if search_s else None,
            "cpu_busy": round(cpu_s / wall / (os.cpu_count() or 1), 2),
            "worker_cpu_ms_per_trial": round(1000 * sum(d["cpu_s"] for d in docs) / n, 1),
            "worker_search_cpu_ms_per_trial": _search_cpu_ms(docs),
            "_stored_at": [datetime.fromisoformat(str(s)).timestamp() for s in created],
            "statements_per_trial": round(db_totals["statements"] / n, 1),
            "transactions_per_trial": round(db_totals["transactions"] / n, 1),
            "round_trips_per_trial": round(_round_trips(url, db_totals) / n, 1),
            "rows_written_per_trial": round(db_totals["rows_written"] / n, 1),
            "db_lock_wait_s": round(db_totals["lock_wait_s"], 2),
            "db_lock_held_ms_per_locked_transaction": round(1000 * db_totals["lock_held_s"]
                                                            / max(1, db_totals["locked_transactions"]), 2),
            "locked_transactions_per_trial": round(db_totals["locked_transactions"] / n, 2),
            # of which row locks (the shared study's row, the GPU row): the rest are claims' locks
            "row_locked_transactions_per_trial": round(db_totals.get("row_locked_transactions", 0) / n, 2),
            "db_row_lock_held_ms_per_transaction": round(1000 * db_totals.get("row_lock_held_s", 0)
                                                         / max(1, db_totals.get("row_locked_transactions", 0)), 2), "db_statement_s": round(db_totals["statement_s"], 2),
            "winners": {p["shape"]: p["winner_us"] for d in docs for p in d["problems"] if p["winner_us"]},
            "per_process": [{"wall_s": round(d["wall_s"], 2), "cpu_s": round(d["cpu_s"], 2),
                             "evaluated": len(d["evaluated"]),
                             "met_after_s": [round(m, 3) for m in d.get("met_after_s", [])]} for d in docs],
            "phases_s": {k: round(v, 3) for k, v in sorted(phases.items())}}


def _round_trips(url: str, db: dict) -> int:
    """A PostgreSQL transaction costs a BEGIN and a COMMIT beside its statements; SQLite's
    BEGIN is a statement already, and none of it crosses a network."""
    return db["statements"] + db["transactions"] * (2 if url.startswith("postgresql") else 1)


def _search_cpu_ms(docs: list[dict]) -> float | None:
    """A worker's CPU between its first and its last evaluation over the trials between them
    (every thread of it: the loop, the heartbeat, the study's writer): the steady cost of a trial,
    without the start-up and the re-timing."""
    spent = [(d["cpu_at"][-1] - d["cpu_at"][0], len(d["cpu_at"]) - 1) for d in docs if len(d.get("cpu_at", [])) > 1]
    trials = sum(n for _s, n in spent)
    return round(1000 * sum(s for s, _n in spent) / trials, 1) if trials else None


def _span(stamps: list) -> float:
    if len(stamps) < 2:
        return 0.0
    first, last = (datetime.fromisoformat(str(s)) for s in (stamps[0], stamps[-1]))
    return (last - first).total_seconds()


# -- the two studies --------------------------------------------------------------------------------


def scale(args, dbs: Databases) -> dict:
    problem = parse_problem(args.problem)
    out = {"machine": f"{os.cpu_count()} cores, the replay aid: no GPU used", "sampler": args.sampler,
           "problem": args.problem, "runs": []}
    for eval_ms in args.eval_ms:
        base = None
        for workers in args.workers:
            trials = max(args.min_trials, args.trials_per_worker * workers)
            url = dbs.new()
            try:
                figures = run(url, workers, [problem], trials, eval_ms, args.sampler, folder=dbs.folder)
            finally:
                dbs.drop(url)
            ideal = workers * 1000 / eval_ms
            figures.update(workers=workers, eval_ms=eval_ms, trials=trials,
                           efficiency=round(figures["trials_per_s"] / ideal, 3) if figures["trials_per_s"] else None)
            base = base or figures
            out["runs"].append(figures)
            print(f"{workers:3d} workers, {eval_ms:g} ms: {figures['trials_per_s']} trials/s, efficiency "
                  f"{figures['efficiency']} (stored span {figures['stored_span_s']} s), {figures['round_trips_per_trial']} round trips/trial, cpu "
                  f"{figures['cpu_busy']}, cpu/trial {figures['worker_search_cpu_ms_per_trial']} ms + server "
                  f"{figures.get('server_search_cpu_ms_per_trial')} ms, busy {figures.get('machine_cpu_busy_in_search')}, "
                  f"lock held {figures['db_lock_held_ms_per_locked_transaction']} ms x "
                  f"{figures['locked_transactions_per_trial']}/trial, load "
                  f"{figures['load_before']}->{figures['load_during_max']}, duplicates {figures['duplicates']}", file=sys.stderr, flush=True)
            write(args.out, out)
    return out


def cases(args, dbs: Databases) -> dict:
    out = {"machine": f"{os.cpu_count()} cores, the replay aid: no GPU used", "eval_ms": args.eval_ms[0], "cases": {}}
    shapes8 = [sgemv_spec(m, n) for m, n in SHAPES]
    plan = {"shapes_8x60": (shapes8, 60), "one_240": [[sgemv_spec(16384, 16)], 240]}
    for name, (shapes, trials) in plan.items():
        for label, processes, gpus in (("1gpu", 1, 1), ("2gpus", 1, 2), ("2procs", 2, 1)):
            if name == "one_240" and label == "2procs":
                continue
            url = dbs.new()
            try:
                figures = run(url, processes, shapes, trials, args.eval_ms[0], args.sampler, gpus=gpus, folder=dbs.folder)
            finally:
                dbs.drop(url)
            out["cases"][f"{name}_{label}"] = figures
            print(f"{name} {label}: {figures['wall_s']} s, phases {figures['phases_s']}", file=sys.stderr, flush=True)
            write(args.out, out)
    for name in plan:
        one = out["cases"][f"{name}_1gpu"]
        for label in ("2gpus", "2procs"):
            other = out["cases"].get(f"{name}_{label}")
            if other:
                other["speedup"] = round(one["wall_s"] / other["wall_s"], 3)
    write(args.out, out)
    return out


def write(path: Path, doc: dict) -> None:
    path.write_text(json.dumps(doc, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["scale", "cases", "worker"])
    parser.add_argument("--db", required=True, help="a PostgreSQL server's URL, or 'sqlite'")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--workers", type=lambda t: [int(x) for x in t.split(",")], default=[8, 16, 32, 64])
    parser.add_argument("--eval-ms", type=lambda t: [float(x) for x in t.split(",")], default=[50.0, 500.0])
    parser.add_argument("--trials-per-worker", type=int, default=12)
    parser.add_argument("--min-trials", type=int, default=0)
    parser.add_argument("--sampler", default=None)
    parser.add_argument("--problem", default=DEFAULT_PROBLEM, help="FAMILY:DTYPE:DIM=V,... (scale)")
    # worker mode
    parser.add_argument("--problems"), parser.add_argument("--recording", default=str(RECORDING))
    parser.add_argument("--trials", type=int), parser.add_argument("--seed", type=int)
    parser.add_argument("--gpus", type=int, default=1), parser.add_argument("--report")
    parser.add_argument("--meet", default=""), parser.add_argument("--parties", type=int, default=0)
    parser.add_argument("--evaluations", help="the file every evaluation is logged to (problem, kernel)")
    args = parser.parse_args()
    if args.what == "worker":
        args.eval_ms = args.eval_ms[0] if isinstance(args.eval_ms, list) else args.eval_ms
        worker(args)
        return 0
    args.sampler = args.sampler or ("random" if args.what == "scale" else "tpe")
    with tempfile.TemporaryDirectory(prefix="autogen-sim-") as folder:
        dbs = Databases(args.db, Path(folder))
        (scale if args.what == "scale" else cases)(args, dbs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
