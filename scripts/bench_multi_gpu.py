"""Wall time of tuning on one GPU against all the GPUs of the machine (needs two GPUs or more).

    python scripts/bench_multi_gpu.py --out DIR [--part shapes|one|all]

  shapes: 8 sgemv shapes, 60 trials each:  `autogen tune sgemv --shapes F --trials 60 --gpus 0`
          against the same with `--gpus all`  (target: >= 1.8x faster on 2 GPUs)
  one:    one shape, 240 trials, `--gpus 0` against `--gpus all`  (target: >= 1.6x)
Every run starts from an empty database and an empty kernel cache (compiles included), as a
user's first tune does. The winners of the 1-GPU and the all-GPU runs are compared by their
stored (re-timed) times: within 2% is the target. Writes DIR/multi_gpu_<gpu>.json, the logs, and
prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchlib import results_path, table, write_results

SHAPES = [(m, n) for m in (4096, 16384) for n in (16, 32, 128, 1024)]
ONE = (16384, 16)


def tune(out: Path, name: str, shapes: list[tuple[int, int]], trials: int, gpus: str) -> dict:
    work = out / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shapes_file = work / "shapes.txt"
    shapes_file.write_text("".join(f"m={m} n={n}\n" for m, n in shapes))
    env = {**os.environ, "AUTOGEN_CACHE_DIR": str(work / "kernels"), "XDG_CACHE_HOME": str(work / "cache"),
           "AUTOGEN_NO_PRETUNED": "1"}
    command = [sys.executable, "-m", "autogen", "tune", "sgemv", "--shapes", str(shapes_file),
               "--trials", str(trials), "--gpus", gpus, "--db", f"sqlite:///{work / 'tuning.db'}", "--json"]
    started = time.monotonic()
    with open(work / "stderr.log", "w") as log:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}); see {work / 'stderr.log'}")
    documents = json.loads(done.stdout)
    documents = documents if isinstance(documents, list) else [documents]
    (work / "result.json").write_text(json.dumps(documents, indent=1))
    winners = {f"{d['problem']['shape']['m']}x{d['problem']['shape']['n']}":
               {"kernel": d["winner"]["kernel"], "time_us": d["winner"]["time_us"],
                "measured": d["trials"]["measured"] + d["trials"]["failed"], "gpus": d.get("gpus")}
               for d in documents}
    print(f"{name}: {wall:.1f} s", file=sys.stderr, flush=True)
    return {"name": name, "gpus": gpus, "trials": trials, "shapes": len(shapes), "wall_s": round(wall, 2),
            "winners": winners}


def compare(one: dict, many: dict, target: float) -> dict:
    ratios = {shape: many["winners"][shape]["time_us"] / w["time_us"] for shape, w in one["winners"].items()}
    worst = max(abs(r - 1) for r in ratios.values())
    speedup = one["wall_s"] / many["wall_s"]
    return {"speedup": round(speedup, 3), "target": target, "met": speedup >= target,
            "winner_ratio_all_over_one": {k: round(v, 4) for k, v in ratios.items()},
            "winners_within_2pct": worst <= 0.02, "worst_winner_gap": round(worst, 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--part", choices=["shapes", "one", "all"], default="all")
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
        report["shapes"] = {"one_gpu": one, "all_gpus": many, **compare(one, many, 1.8)}
    if args.part in ("one", "all"):
        one = tune(args.out, "one_1gpu", [ONE], 240, "0")
        many = tune(args.out, "one_all", [ONE], 240, "all")
        report["one_problem"] = {"one_gpu": one, "all_gpus": many, **compare(one, many, 1.6)}
    write_results(args.out, "multi_gpu", names[0], report)
    print(f"GPUs: {', '.join(names)}")
    print(table(("benchmark", "1 GPU s", f"{count} GPUs s", "speedup", "target", "winners <=2%", "worst gap"),
                ((label, f"{r['one_gpu']['wall_s']:.1f}", f"{r['all_gpus']['wall_s']:.1f}", f"{r['speedup']:.2f}x",
                  f"{r['target']:.1f}x", r["winners_within_2pct"], f"{100 * r['worst_winner_gap']:.1f}%")
                 for key, label in (("shapes", "8 shapes x 60 trials"), ("one_problem", "1 shape x 240 trials"))
                 if (r := report.get(key)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
