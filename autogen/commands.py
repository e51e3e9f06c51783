"""The work behind each CLI subcommand; cli.py parses, this module acts."""

from __future__ import annotations

import statistics
import sys

from .errors import GpuUnavailableError, InvalidConfigError, NotTunedError, UsageError
from .families import get_family
from .report import performance, render_table, to_json, tune_summary, tune_table


def run(args) -> int:
    handler = {"tune": cmd_tune, "bench": cmd_bench, "list": cmd_list, "show": cmd_show, "db": cmd_db,
               "export": cmd_export}
    return handler[args.command](args)


def cmd_tune(args) -> int:
    from .cli import problems_from_args
    from .gpu import require_cupy
    from .tuner import TuneOptions, tune

    problems = problems_from_args(args)
    require_cupy()
    options = TuneOptions(trials=args.trials, timeout_s=args.timeout, sampler=args.sampler, seed=args.seed,
                          cache_mode=args.cache, db_url=args.db, warm_start=not args.no_warm_start,
                          eval_timeout_s=args.eval_timeout,
                          **({"workers": args.workers} if args.workers else {}))
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    documents = []
    for problem in problems:
        result = tune(problem, options)
        document = tune_summary(result)
        documents.append(document)
        if not args.json:
            print(tune_table(document) + ("\n" if len(problems) > 1 else ""), flush=True)
    if args.json:
        print(to_json(documents[0] if len(documents) == 1 else documents))
    return 0 if all(d["winner"] for d in documents) else 1


def cmd_bench(args) -> int:
    from .cli import problems_from_args
    from .compile import compile_cubin
    from .gpu import require_cupy
    from .render import render
    from .worker import IsolatedEvaluator, WorkSpec
    from tuning_db import TuningDB

    (problem,) = problems_from_args(args)
    require_cupy()
    family = get_family(problem.family)
    db = TuningDB(args.db)
    with IsolatedEvaluator(WorkSpec(problem.family, problem.dtype, problem.dims, args.cache)) as evaluator:
        winner = db.winner(evaluator.device, problem.family, problem.dtype, problem.shape_key)
        if winner is None:
            raise NotTunedError(f"nothing tuned for {problem} on {evaluator.device.name} in {db.url}; "
                                f"run `autogen tune {problem.family} ...` first")
        config = family.space.check(winner.trial.params)  # never render unchecked stored values
        cubin = compile_cubin(render(family, problem.dtype, config), evaluator.device.arch)
        outcome = evaluator.evaluate(winner.trial.kernel_name, cubin, config.as_dict())
        if outcome.status != "ok":
            raise NotTunedError(f"the stored winner {winner.trial.kernel_name} failed now: {outcome.reason}")
        peer = evaluator.call("time_peer")
        copy_gbs = evaluator.call("copy_bandwidth_gbs")
    time_us = statistics.median(outcome.samples_us)
    peer_us = statistics.median(peer[1]) if peer else None
    bytes_moved = family.bytes_moved(problem, family.timing_case(problem))
    document = {
        "problem": str(problem), "gpu": evaluator.device.name, "kernel": winner.trial.kernel_name,
        "cache": args.cache, "stored_time_us": winner.trial.time_us, "error": outcome.error,
        "peer": peer[0] if peer else None, "copy_bandwidth_gb_per_s": round(copy_gbs, 1),
        **performance(time_us, bytes_moved, family.flops(problem), copy_gbs, peer_us),
    }
    if args.json:
        print(to_json(document))
    else:
        print(render_table([
            ("problem", document["problem"]), ("gpu", document["gpu"]), ("kernel", document["kernel"]),
            ("time now", f"{time_us:.3f} us (stored {winner.trial.time_us:.3f} us)"),
            ("bandwidth", f"{document['gb_per_s']} GB/s, {document['pct_of_floor']}% of the copy bandwidth "
                          f"{document['copy_bandwidth_gb_per_s']} GB/s"),
            ("peer", f"{document['peer']} {peer_us:.3f} us -> speedup {document['speedup_vs_peer']:.2f}x"
             if peer else "unavailable"),
            ("validation", f"relative L2 error {outcome.error:.2e}"),
        ]))
    return 0


def cmd_list(args) -> int:
    from tuning_db import TuningDB

    if args.family:
        get_family(args.family)
    winners, invalid = TuningDB(args.db, readonly=True).winners_checked(family=args.family)  # reads only
    _report_invalid(invalid)
    rows = []
    for w in sorted(winners, key=lambda w: (w.device.name, w.trial.family, w.trial.dtype, w.trial.shape_key,
                                            w.trial.cache_mode)):
        speedup = w.peer_time_us / w.trial.time_us if w.peer_time_us else None
        rows.append({"gpu": w.device.name, "family": w.trial.family, "dtype": w.trial.dtype,
                     "shape": w.trial.shape_key, "cache": w.trial.cache_mode, "kernel": w.trial.kernel_name,
                     "time_us": round(w.trial.time_us, 3),
                     "peer_time_us": round(w.peer_time_us, 3) if w.peer_time_us else None,
                     "speedup": round(speedup, 3) if speedup else None})
    if args.json:
        print(to_json(rows))
        return 0
    if not rows:
        print("nothing tuned yet", file=sys.stderr)
        return 0
    header = ("gpu", "family", "dtype", "shape", "cache", "kernel", "time_us", "peer_time_us", "speedup")
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in header]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(str(r[h] if r[h] is not None else "-").ljust(w) for h, w in zip(header, widths)))
    return 0


def cmd_show(args) -> int:
    from tuning_db import TuningDB, one_per_problem
    from .cli import problems_from_args
    from .render import render

    (problem,) = problems_from_args(args)
    family = get_family(problem.family)
    found, invalid = TuningDB(args.db, readonly=True).winners_checked(  # reads only
        family=problem.family, dtype=problem.dtype, shape_key=problem.shape_key)
    matches = one_per_problem(found)  # the cold-cache winner where both are stored
    gpu = args.gpu or _local_gpu_name()
    if gpu:
        matches = [w for w in matches if w.device.name == gpu]
        invalid = [row for row in invalid if row.gpu == gpu]
    _report_invalid(invalid)
    if not matches and invalid:
        raise InvalidConfigError(f"the stored winner for {problem} is invalid: {invalid[0].describe()}")
    if not matches:
        raise NotTunedError(f"nothing stored for {problem}" + (f" on {gpu}" if gpu else ""))
    if len(matches) > 1:
        names = ", ".join(sorted({w.device.name for w in matches}))
        raise UsageError(f"{problem} is tuned on several GPUs ({names}); pick one with --gpu")
    winner = matches[0]
    config = family.space.check(winner.trial.params)
    document = {
        "problem": str(problem), "kernel": winner.trial.kernel_name, "params": config.as_dict(),
        "time_us": winner.trial.time_us, "peer": winner.peer_name, "peer_time_us": winner.peer_time_us,
        "provenance": {
            "gpu": winner.device.name, "compute_capability": winner.device.compute_capability,
            "sm_count": winner.device.sm_count, "l2_bytes": winner.device.l2_bytes,
            "driver_version": winner.device.driver_version, "runtime_version": winner.device.runtime_version,
            "nvrtc_version": winner.device.nvrtc_version, "compile_options": winner.trial.compile_options,
            "source_hash": winner.trial.source_hash, "cache_mode": winner.trial.cache_mode,
            "autogen_version": winner.autogen_version, "updated_at": winner.updated_at,
        },
        "source": render(family, problem.dtype, config),
    }
    if args.json:
        print(to_json(document))
        return 0
    rows = [(k, v) for k, v in document.items() if k not in ("source", "provenance", "params")]
    rows.append(("params", " ".join(f"{k}={v}" for k, v in document["params"].items())))
    rows += list(document["provenance"].items())
    print(render_table(rows))
    print()
    print(document["source"])
    return 0


def cmd_export(args) -> int:
    from .export import ExportRequest, export

    result = export(ExportRequest(args.family, args.out, gpu=args.gpu, arch=args.arch, db_url=args.db,
                                  self_test=args.self_test))
    summary = result.summary()
    if args.self_test and not summary["self_test_hook"]:
        print(f"autogen: note: {args.family} has no self-test hook yet; the self-test skips it", file=sys.stderr)
    if args.json:
        print(to_json(summary))
        return 0
    shapes = [f"{e['symbol']} {s['shape']}: {s['kernel']}" for e in summary["entry_points"] for s in e["shapes"]]
    defaults = [f"{e['symbol']}: default {e['default']}" for e in summary["entry_points"] if e["default"]]
    print(render_table([("family", summary["family"]), ("gpu", f"{summary['gpu']} ({summary['arch']})"),
                        ("variants", len(summary["variants"])), *(("dispatch", line) for line in shapes + defaults),
                        *(("wrote", path) for path in summary["files"])]))
    return 0


def cmd_db(args) -> int:
    from tuning_db import upgrade

    revision = upgrade(args.db)
    print(f"database at revision {revision}")
    return 0


def _report_invalid(invalid) -> None:
    """One stderr line per stored row that cannot be read; the command goes on without it."""
    for row in invalid:
        print(f"autogen: warning: skipped invalid row {row.describe()}", file=sys.stderr)


def _local_gpu_name() -> str | None:
    try:
        from .gpu import device_identity
        return device_identity().name
    except GpuUnavailableError:
        return None
