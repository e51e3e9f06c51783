"""`autogen tune`: the problems a command line names, tuned on this machine's GPUs (resuming from
the database), each summary printed as its problem finishes; `tune-model` tunes through the same."""

from __future__ import annotations

import sys
from dataclasses import replace

from autogen.cli.options import check_storing_db, check_tune_options, family_of, problems_from_args
from autogen.distributed.gpu_option import parse_gpus, resolve_gpus
from autogen.distributed.order import in_start_order
from autogen.report import to_json, tune_summary, tune_table
from autogen.search.progress import ProgressOutput


def cmd_tune(args) -> int:
    check_tune_options(args)
    check_storing_db(args.db, "tune")
    problems = problems_from_args(args, family_of(args))
    documents = tune_documents(args, problems, tables=not args.json)
    if args.json:
        print(to_json(documents[0] if len(documents) == 1 else documents))
    return 0 if all(d["winner"] for d in documents) else 1


def tune_documents(args, problems, tables: bool) -> list[dict]:
    """Tune `problems` with the tune options in `args` (the GPUs of --gpus, resuming from the
    database), each problem's summary (autogen.report.tune_summary) in order; `tables`: print
    each problem's table as it finishes. Problems are tuned from this process's place in the
    list round (autogen.distributed.order), so processes sharing a database start apart."""
    in_turn = in_start_order(problems)
    if getattr(args, "gpus", None) is None:
        _prestart_gpu_work(args, in_turn[0])  # before the tuner's imports: they overlap its start-up
    from autogen.distributed.multi_gpu import tune_problems
    gpus = parse_gpus(getattr(args, "gpus", None))
    from autogen.gpu.device import require_cupy, require_gpu
    from autogen.search.tuner import TuneOptions, check_options

    options = TuneOptions(trials=args.trials, timeout_s=args.timeout, sampler=args.sampler, seed=args.seed,
                          cache_mode=args.cache, db_url=args.db, warm_start=not args.no_warm_start,
                          eval_timeout_s=args.eval_timeout, refresh=getattr(args, "refresh", False),
                          lease_s=args.lease, workers=args.workers)
    try:
        check_options(options)
        if gpus is not None:
            options = replace(options, gpus=resolve_gpus(gpus, require_cupy().cuda.runtime.getDeviceCount()))
        else:
            require_gpu()  # through the driver: a tune answered from the database imports no CuPy
    except BaseException:
        from autogen.gpu.backend import discard_prestarted
        discard_prestarted()  # no GPU (say): stopped now, not left to outlive this process
        raise

    # On a terminal, a bar per problem instead of a line per trial; never with --json.
    progress = ProgressOutput(sys.stderr, bars=False if args.json else None)

    def show(result) -> None:  # each table as its problem finishes (several GPUs: in that order)
        progress.finish(str(result.problem))
        if tables:
            with progress.aside():
                print(tune_table(tune_summary(result)) + ("\n" if len(problems) > 1 else ""), flush=True)

    try:
        results = tune_problems(in_turn, options, progress, on_result=show)
    finally:
        progress.close()
        from autogen.gpu.backend import discard_prestarted
        discard_prestarted()  # unused when the database answered
    by_problem = {result.problem: tune_summary(result) for result in results}
    return [by_problem[problem] for problem in problems]


def _prestart_gpu_work(args, problem) -> None:
    """Spawn the GPU worker and the compile pool of the first problem now (autogen.gpu.backend),
    where CuPy is installed; without it the tuner says so after its checks, as before."""
    import importlib.util
    import os

    if os.environ.get("AUTOGEN_NO_PRESTART") or importlib.util.find_spec("cupy") is None:
        return
    from autogen.gpu.backend import prestart
    from autogen.gpu.evaluator import WorkSpec
    from autogen.gpu.worker import default_workers
    prestart(WorkSpec.of(problem, args.cache), args.workers or default_workers(), args.eval_timeout)
