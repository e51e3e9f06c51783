"""Wall time of tuning on one GPU against all the GPUs of the machine (needs two GPUs or more).

    python scripts/bench_multi_gpu.py --out DIR [--part shapes|one|all|long|procs]

  shapes: 8 sgemv shapes, 60 trials each:  `autogen tune sgemv --shapes F --trials 60 --gpus 0`
          against the same with `--gpus all`  (target: >= 1.9x faster on 2 GPUs)
  one:    one shape, 240 trials, `--gpus 0` against `--gpus all`  (target: >= 1.6x)
  long:   the 8 shapes with 240 trials each (not one of the issue's runs: the same work with the
          start-up's fixed seconds a smaller share, to show what the fixed part costs the ratio)
  procs:  the 8 shapes by one process on GPU 0 against two processes at once, one per GPU
          (CUDA_VISIBLE_DEVICES), sharing one database: a SQLite file, or with --db URL a
          PostgreSQL database on that server (target: >= 1.8x)
Every run starts from an empty database, an empty kernel cache and an empty CuPy cache (compiles
included), as a
user's first tune does. The winners of the 1-GPU and the all-GPU runs are compared by their
stored (re-timed) times: within 2% is the target. Writes DIR/multi_gpu_<gpu>.json (with each
process's phases: `phases_s`), the logs, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchlib import results_path, table, write_results

SHAPES = [(m, n) for m in (4096, 16384) for n in (16, 32, 128, 1024)]
ONE = (16384, 16)


def tune(out: Path, name: str, shapes: list[tuple[int, int]], trials: int, gpus: str, processes: int = 1,
         db_url: str | None = None) -> dict:
    """One cold run: its own database (a SQLite file, or ``db_url``, a fresh PostgreSQL database),
    kernel cache and CuPy cache. ``processes`` > 1: that many `autogen tune` processes at once,
    one per GPU (CUDA_VISIBLE_DEVICES), sharing the database as machines would."""
    work = out / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shapes_file = work / "shapes.txt"
    shapes_file.write_text("".join(f"m={m} n={n}\n" for m, n in shapes))
    env = {**os.environ, "AUTOGEN_CACHE_DIR": str(work / "kernels"), "XDG_CACHE_HOME": str(work / "cache"),
           "CUPY_CACHE_DIR": str(work / "cupy"), "AUTOGEN_NO_PRETUNED": "1"}
    url = db_url or f"sqlite:///{work / 'tuning.db'}"
    if processes > 1:
        subprocess.run([sys.executable, "-m", "autogen", "db", "upgrade", "--db", url], check=True, env=env,
                       stdout=subprocess.DEVNULL)  # once, as the multi-machine recipe does
    command = [sys.executable, "-m", "autogen", "tune", "sgemv", "--shapes", str(shapes_file),
               "--trials", str(trials), "--db", url, "--json"]
    started = time.monotonic()
    runs = []
    for i in range(processes):
        gpu_env = {**env, "CUDA_VISIBLE_DEVICES": str(i)} if processes > 1 else env
        runs.append(subprocess.Popen(command + (["--gpus", gpus] if processes == 1 else []), env=gpu_env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    # The log threads start after every process: a thread takes an id from the same counter as a
    # process, and the processes' consecutive ids are what makes every other one go round its
    # problems backwards (autogen.distributed.order), as from a shell loop.
    logs = [threading.Thread(target=_timestamped, args=(run.stderr, work / f"stderr{i}.log", started))
            for i, run in enumerate(runs)]
    for log in logs:
        log.start()
    outputs = [""] * len(runs)

    def read_output(i: int) -> None:
        outputs[i] = runs[i].stdout.read()

    readers = [threading.Thread(target=read_output, args=(i,)) for i in range(len(runs))]
    for thread in readers:
        thread.start()
    for thread in readers + logs:
        thread.join()
    for run in runs:
        run.wait()
    wall = time.monotonic() - started
    if any(run.returncode != 0 for run in runs):
        raise SystemExit(f"{' '.join(command)} failed; see {work}/stderr*.log")
    per_process = []
    for output in outputs:
        documents = json.loads(output)
        per_process.append(documents if isinstance(documents, list) else [documents])
    (work / "result.json").write_text(json.dumps(per_process, indent=1))
    documents = per_process[-1]  # every process stores its own winner; the last one's stands
    winners = {f"{d['problem']['shape']['m']}x{d['problem']['shape']['n']}":
               {"kernel": d["winner"]["kernel"], "time_us": d["winner"]["time_us"],
                "measured": sum(p[i]["trials"]["measured"] + p[i]["trials"]["failed"] for p in per_process),
                "gpus": d.get("gpus")}
               for i, d in enumerate(documents)}
    print(f"{name}: {wall:.1f} s", file=sys.stderr, flush=True)
    return {"name": name, "gpus": gpus, "processes": processes, "trials": trials, "shapes": len(shapes),
            "wall_s": round(wall, 2), "winners": winners, "phases_s": [phase_totals(p) for p in per_process]}


def _timestamped(stream, path: Path, started: float) -> None:
    """Copy a process's progress lines to ``path``, each prefixed with the seconds since the run
    began: when each GPU's first and last trials came (a helper that starts late shows)."""
    with open(path, "w") as log:
        for line in stream:
            log.write(f"{time.monotonic() - started:7.3f} {line}")


def phase_totals(documents: list[dict]) -> dict:
    """One process's phases (autogen.search.tuner: wall parts, the search loops' parts, the
    database's counts), summed over its problems."""
    totals: dict = {}
    for d in documents:
        for key, value in (d.get("phases_s") or {}).items():
            totals[key] = round(totals.get(key, 0) + value, 3)
    return totals


def compare(one: dict, many: dict, target: float) -> dict:
    ratios = {shape: many["winners"][shape]["time_us"] / w["time_us"] for shape, w in one["winners"].items()}
    worst = max(abs(r - 1) for r in ratios.values())
    speedup = one["wall_s"] / many["wall_s"]
    return {"speedup": round(speedup, 3), "target": target, "met": speedup >= target,
            "winner_ratio_all_over_one": {k: round(v, 4) for k, v in ratios.items()},
            "winners_within_2pct": worst <= 0.02, "worst_winner_gap": round(worst, 4)}


def fresh_database(server: str | None) -> str | None:
    """A new database on the PostgreSQL server ``server``; None (a SQLite file per run) without one."""
    if not server:
        return None
    import uuid

    from sqlalchemy import create_engine, text

    name = "autogen_bench_" + uuid.uuid4().hex[:8]
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return server.rsplit("/", 1)[0] + "/" + name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--part", choices=["shapes", "one", "all", "long", "procs"], default="all")
    parser.add_argument("--db", default=None, help="procs: a PostgreSQL server's URL (a database per run) "
                        "instead of a SQLite file")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import cupy  # noqa: the GPUs this machine has, for the record

    count = cupy.cuda.runtime.getDeviceCount()
    names = [cupy.cuda.runtime.getDeviceProperties(i)["name"] for i in range(count)]
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    report_path = results_path(args.out, "multi_gpu", names[0] if names else None)
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report["gpus"] = names
    if count < 2:
        raise SystemExit(f"needs two GPUs or more; this machine has {count}")
    if args.part in ("shapes", "all"):
        one = tune(args.out, "shapes_1gpu", SHAPES, 60, "0")
        many = tune(args.out, "shapes_all", SHAPES, 60, "all")
        report["shapes"] = {"one_gpu": one, "all_gpus": many, **compare(one, many, 1.9)}
    if args.part in ("one", "all"):
        one = tune(args.out, "one_1gpu", [ONE], 240, "0")
        many = tune(args.out, "one_all", [ONE], 240, "all")
        report["one_problem"] = {"one_gpu": one, "all_gpus": many, **compare(one, many, 1.6)}
    if args.part == "long":
        one = tune(args.out, "long_1gpu", SHAPES, 240, "0")
        many = tune(args.out, "long_all", SHAPES, 240, "all")
        report["long"] = {"one_gpu": one, "all_gpus": many, **compare(one, many, 1.9)}
    if args.part == "procs":
        key = "procs_" + ("postgresql" if args.db else "sqlite")
        one = tune(args.out, f"{key}_1", SHAPES, 60, "0", db_url=fresh_database(args.db))
        many = tune(args.out, f"{key}_2", SHAPES, 60, "all", processes=2, db_url=fresh_database(args.db))
        report[key] = {"one_gpu": one, "all_gpus": many, **compare(one, many, 1.8)}
    write_results(args.out, "multi_gpu", names[0], report)
    print(f"GPUs: {', '.join(names)}")
    print(table(("benchmark", "1 GPU s", f"{count} GPUs s", "speedup", "target", "winners <=2%", "worst gap"),
                ((label, f"{r['one_gpu']['wall_s']:.1f}", f"{r['all_gpus']['wall_s']:.1f}", f"{r['speedup']:.2f}x",
                  f"{r['target']:.1f}x", r["winners_within_2pct"], f"{100 * r['worst_winner_gap']:.1f}%")
                 for key, label in (("shapes", "8 shapes x 60 trials"), ("one_problem", "1 shape x 240 trials"),
                                    ("long", "8 shapes x 240 trials"),
                                    ("procs_sqlite", "2 processes, one SQLite file"),
                                    ("procs_postgresql", "2 processes, one PostgreSQL"))
                 if (r := report.get(key)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
