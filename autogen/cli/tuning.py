"""`autogen tune`: the problems a command line names, tuned on this machine's GPUs (resuming from
the database), each summary printed as its problem finishes; `tune-model` tunes through the same."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from autogen.cli.options import check_storing_db, check_tune_options, family_of, problems_from_args
from autogen.distributed.gpu_option import parse_gpus, resolve_gpus
from autogen.distributed.order import in_start_order
from autogen.paths import installed_file
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
    gpus = parse_gpus(getattr(args, "gpus", None))
    _start_gpu_work_early(args, in_turn, gpus)  # before the tuner's imports: they overlap its start-up
    from autogen.distributed.multi_gpu import tune_problems
    from autogen.gpu.device import gpu_count, require_gpu
    from autogen.search.tuner import TuneOptions, check_options

    options = TuneOptions(trials=args.trials, timeout_s=args.timeout, sampler=args.sampler, seed=args.seed,
                          cache_mode=args.cache, db_url=args.db, warm_start=not args.no_warm_start,
                          eval_timeout_s=args.eval_timeout, refresh=getattr(args, "refresh", False),
                          lease_s=args.lease, workers=args.workers)
    try:
        check_options(options)
        if gpus is not None:
            options = replace(options, gpus=resolve_gpus(gpus, gpu_count()))
        else:
            require_gpu()  # through the driver: a tune answered from the database imports no CuPy
    except BaseException:
        _discard_early_work()  # no GPU (say): stopped now, not left to outlive this process
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
        _discard_early_work()  # unused when the database answered
    by_problem = {result.problem: tune_summary(result) for result in results}
    return [by_problem[problem] for problem in problems]


def _start_gpu_work_early(args, problems, gpus) -> None:
    """Spawn now, before the tuner's imports, what the first problems' GPUs will need: the first
    GPU's worker (autogen.gpu.backend.prestart) and, on several GPUs, the other GPUs' agents
    (autogen.distributed.gpu_agent.start_agents_early), each of which starts its own worker
    before its imports. Where CuPy is not installed, the driver does not answer, or --gpus names
    no GPU here, nothing: the tuner says why after its checks, as before."""
    if os.environ.get("AUTOGEN_NO_PRESTART") or installed_file("cupy") is None:
        return
    from autogen.gpu.backend import prestart
    from autogen.gpu.evaluator import WorkSpec
    from autogen.gpu.worker import default_workers
    ordinals: tuple = (None,)  # no --gpus: the current GPU
    if gpus is not None:
        from autogen.gpu.device import driver_device_count
        try:
            ordinals = resolve_gpus(gpus, driver_device_count())
        except Exception:  # no driver, or GPUs it does not have: reported after the checks
            return
    workers = args.workers or default_workers(len(ordinals))
    prestart(WorkSpec.of(problems[0], args.cache, ordinals[0]), workers, args.eval_timeout)
    if len(ordinals) > 1:
        from autogen.distributed.gpu_agent import start_agents_early
        start_agents_early(ordinals, problems, args.trials, args.cache, workers, args.eval_timeout)


def _discard_early_work() -> None:
    """Stop what _start_gpu_work_early spawned and no tuner took (imported only if it ran)."""
    backend = sys.modules.get("autogen.gpu.backend")
    if backend is not None:
        backend.discard_prestarted()
    agents = sys.modules.get("autogen.distributed.gpu_agent")
    if agents is not None:
        agents.discard_early_agents()
