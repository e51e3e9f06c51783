"""The work behind each CLI subcommand; cli.py parses, this module acts."""

from __future__ import annotations

import math
import statistics
import sys

from autogen.catalog.stored import unusable_reason, winner_unusable_reason
from autogen.cli.options import check_export_out, check_storing_db, family_of, missing_sqlite_file, problems_from_args
from autogen.core.registry import check_family_renders, get_family, registered_family
from autogen.errors import AutogenError, GpuUnavailableError, InvalidConfigError, NotTunedError
from autogen.gpu.compile import compile_cubin
from autogen.gpu.resources import kernel_resources, nvcc_path, nvcc_version
from autogen.report import performance, render_table, terminal_text, to_json


def cmd_bench(args) -> int:
    from tuning_db import TuningDB

    from autogen.gpu.device import require_cupy
    from autogen.core.render import render
    from autogen.gpu.worker import IsolatedEvaluator
    from autogen.gpu.evaluator import WorkSpec

    family = family_of(args)
    (problem,) = problems_from_args(args, family)
    require_cupy()
    _note_missing_db(args.db)
    db = TuningDB(args.db, readonly=True)  # bench only reads: a missing file is not created
    with IsolatedEvaluator(WorkSpec.of(problem, args.cache)) as evaluator:
        winner = db.winner(evaluator.device, problem.family, problem.dtype, problem.shape_key)
        if winner is None:
            raise NotTunedError(f"nothing tuned for {problem} on {evaluator.device.name} in {db.url}; "
                                f"run `autogen tune {problem.family} ...` first")
        reason = unusable_reason(family, problem.dtype, problem.traits, winner.trial)
        if reason:  # its stored time is not that of the kernel its params render
            raise InvalidConfigError(f"the stored winner of {problem} cannot be re-measured: {reason}")
        config = family.space.check(winner.trial.params)  # never render unchecked stored values
        name = family.kernel_name(problem.dtype, config, problem.traits)
        cubin = compile_cubin(render(family, problem.dtype, config, traits=problem.traits), evaluator.device.arch,
                              family_options=family.compiler_options)
        outcome = evaluator.evaluate(name, cubin, config.as_dict())
        if outcome.status != "ok":
            raise NotTunedError(f"the stored winner {name} failed now: {outcome.reason}")
        peer = evaluator.time_peer()
        ceilings = evaluator.ceilings()
    time_us = statistics.median(outcome.samples_us)
    peer_us = statistics.median(peer[1]) if peer else None
    bytes_moved = family.bytes_moved(problem, family.timing_case(problem))
    document = {
        "problem": str(problem), "gpu": evaluator.device.name, "kernel": name,
        "cache": args.cache, "stored_time_us": winner.trial.time_us, "error": outcome.error,
        "peer": peer[0] if peer else None, "copy_bandwidth_gb_per_s": round(ceilings.copy_gbs, 1),
        "fp32_peak_tflop_per_s": round(ceilings.fp32_tflops, 2),
        **performance(time_us, bytes_moved, family.flops(problem), ceilings.copy_gbs, peer_us,
                      family.roofline, ceilings.fp32_tflops),
    }
    if args.json:
        print(to_json(document))
        return 0
    ceiling = (f"the FP32 peak {document['fp32_peak_tflop_per_s']} TFLOP/s" if family.roofline == "compute"
               else f"the copy bandwidth {document['copy_bandwidth_gb_per_s']} GB/s")
    print(render_table([
        ("problem", document["problem"]), ("gpu", document["gpu"]), ("kernel", document["kernel"]),
        ("time now", f"{time_us:.3f} us (stored {winner.trial.time_us:.3f} us)"),
        ("throughput", f"{document['gb_per_s']} GB/s" + (f", {document['tflop_per_s']} TFLOP/s"
                                                         if document["tflop_per_s"] else "")),
        ("% of floor", f"{document['pct_of_floor']}% of {ceiling}"),
        ("peer", f"{document['peer']} {peer_us:.3f} us -> speedup {document['speedup_vs_peer']:.2f}x"
         if peer else "unavailable"),
        ("validation", f"relative L2 error {outcome.error:.2e}"),
    ]))
    return 0


def _winners(db_url, **filters):
    """((source, winner) pairs, invalid rows) of the user's database, opened read-only, and the
    shipped catalog."""
    from tuning_db import TuningDB

    from autogen.catalog.pretuned import WithCatalog
    _note_missing_db(db_url)
    found, invalid = WithCatalog(TuningDB(db_url, readonly=True)).labelled_winners(**filters)
    return _consistent(found), invalid


def _consistent(found: list) -> list:
    """The (source, winner) pairs whose family, where known here, can render the winner under
    its stored name (autogen.catalog.stored); the others are reported, one line each, and skipped."""
    kept = []
    for source, winner in found:
        family = registered_family(winner.trial.family)  # a name read from data: never imported
        if family is None:
            kept.append((source, winner))  # an unknown family: its rows are shown as such
            continue
        reason = winner_unusable_reason(family, winner)
        if reason:
            print(f"autogen: warning: skipped the stored {terminal_text(winner.trial.family)} "
                  f"{terminal_text(winner.trial.dtype)} winner for {terminal_text(winner.trial.shape_key)} on "
                  f"{terminal_text(winner.device.name)} ({source}): {terminal_text(reason)}", file=sys.stderr)
            continue
        kept.append((source, winner))
    return kept


def cmd_list(args) -> int:
    if args.family:
        get_family(args.family)
    found, invalid = _winners(args.db, family=args.family)
    _report_invalid(invalid)
    stale_of = _staleness()
    rows = []
    for source, w in sorted(found,
                            key=lambda p: (p[1].device.name, p[1].trial.family, p[1].trial.dtype, p[1].trial.shape_key,
                                           p[1].trial.cache_mode)):
        speedup = w.peer_time_us / w.trial.time_us if w.peer_time_us and w.trial.time_us else None
        rows.append({"gpu": w.device.name, "family": w.trial.family, "dtype": w.trial.dtype,
                     "shape": w.trial.shape_key, "cache": w.trial.cache_mode, "kernel": w.trial.kernel_name,
                     "time_us": round(w.trial.time_us, 3) if w.trial.time_us else None,
                     "peer_time_us": round(w.peer_time_us, 3) if w.peer_time_us else None,
                     "speedup": round(speedup, 3) if speedup else None, "source": source,
                     "stale": stale_of(w)})
    if args.json:
        print(to_json(rows))
        return 0
    if not rows:
        print("nothing tuned yet", file=sys.stderr)
        return 0
    header = ("gpu", "family", "dtype", "shape", "cache", "kernel", "time_us", "peer_time_us", "speedup", "source",
              "stale")
    cells = [[terminal_text(("; ".join(r[h]) or "-") if h == "stale" else r[h] if r[h] is not None else "-")
              for h in header] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in cells:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    return 0


def _staleness():
    """winner -> why it is stale here (autogen.catalog.environment): template and autogen version always;
    driver, runtime and NVRTC for winners of this machine's GPU, where one is visible."""
    from autogen.catalog.environment import stale_reasons, winner_source_hash

    try:
        from autogen.gpu.device import device_identity
        local = device_identity()
    except (GpuUnavailableError, AutogenError):
        local = None

    def stale(winner) -> list[str]:
        family = registered_family(winner.trial.family)  # read from a row: never imported
        if family is None:
            return ["unknown family"]
        same_gpu = local is not None and (local.name, local.compute_capability) == (
            winner.device.name, winner.device.compute_capability)
        return list(stale_reasons(winner, winner_source_hash(family, winner), local if same_gpu else None))

    return stale


def cmd_show(args) -> int:
    from tuning_db import one_per_problem

    from autogen.core.render import render

    family = family_of(args)
    (problem,) = problems_from_args(args, family)
    found, invalid = _winners(args.db, family=problem.family, dtype=problem.dtype, shape_key=problem.shape_key)
    matches = [(s, w) for s, w in found if w in one_per_problem([w for _, w in found])]  # cold first
    gpu = args.gpu or _local_gpu_name()
    if gpu:
        matches = [(s, w) for s, w in matches if w.device.name == gpu]
        invalid = [row for row in invalid if row.gpu == gpu]
    _report_invalid(invalid)
    if not matches and invalid:
        raise InvalidConfigError(f"the stored winner for {problem} is invalid: {invalid[0].describe()}")
    if not matches:
        raise NotTunedError(f"nothing stored for {problem}" + (f" on {gpu}" if gpu else ""))
    if args.arch:
        from autogen.export.writer import arch_to_cc
        cc = arch_to_cc(args.arch)
        matches = [(s, w) for s, w in matches if w.device.compute_capability == cc]
        if not matches:
            raise NotTunedError(f"nothing stored for {problem} on {args.arch}")
    if len(matches) > 1:
        source, winner = _most_tuned(args.db, family, matches)
    else:
        source, winner = matches[0]
    try:
        config = family.space.check(winner.trial.params)
    except InvalidConfigError as exc:
        raise InvalidConfigError(f"the stored winner of {problem} is invalid: {exc}") from None
    name = family.kernel_name(problem.dtype, config, problem.traits)  # what the rendered source defines
    document = {
        "problem": str(problem), "kernel": name, "params": config.as_dict(),
        "time_us": winner.trial.time_us, "peer": winner.peer_name, "peer_time_us": winner.peer_time_us,
        "stored_in": "the shipped catalog" if source == "shipped" else "your database",
        "provenance": {
            "gpu": winner.device.name, "compute_capability": winner.device.compute_capability,
            "sm_count": winner.device.sm_count, "l2_bytes": winner.device.l2_bytes,
            "driver_version": winner.device.driver_version, "runtime_version": winner.device.runtime_version,
            "nvrtc_version": winner.device.nvrtc_version, "compile_options": winner.trial.compile_options,
            "source_hash": winner.trial.source_hash, "cache_mode": winner.trial.cache_mode,
            "autogen_version": winner.autogen_version, "tuned_at": winner.updated_at,
        },
        "source": render(family, problem.dtype, config, traits=problem.traits),
    }
    if args.resources:
        document["resources"] = _resources(document["source"], winner.device.arch,
                                           {name + step.suffix: step.launch for step in family.plan(problem, config)},
                                           family.compiler_options)
    if args.json:
        print(to_json(document))
        return 0
    rows = [(k, v) for k, v in document.items() if k not in ("source", "provenance", "params", "resources")]
    rows.append(("params", " ".join(f"{k}={v}" for k, v in document["params"].items())))
    rows += list(document["provenance"].items())
    if args.resources:
        report = document["resources"]
        rows.append(("resources from", f"nvcc {report['nvcc']} for {report['arch']}"))
        rows += [(f"resources {k['kernel']}", k["summary"]) for k in report["kernels"]]
    print(render_table([(label, terminal_text(value)) for label, value in rows]))
    print()
    print(f"// source of {name}")
    print(document["source"])
    return 0


def _resources(source: str, arch: str, launches: dict, family_options: tuple[str, ...] = ()) -> dict:
    """ptxas's report of the shown kernel(s), compiled by nvcc for `arch` (autogen.gpu.resources),
    each with the launch it gets for the shown shape (`launches`: symbol -> Launch), since
    registers and shared memory bound the blocks per SM only together with the block size."""
    nvcc = nvcc_path()
    kernels = []
    for k in kernel_resources(source, arch, nvcc, family_options):
        entry = {**k.as_dict(), "summary": k.summary()}
        launch = launches.get(k.kernel)
        if launch is not None:
            entry.update(grid=list(launch.grid), block=list(launch.block), dynamic_shared_bytes=launch.shared_bytes)
            entry["summary"] += (f"; launched with {math.prod(launch.grid)} blocks of {math.prod(launch.block)} "
                                 f"threads, {launch.shared_bytes} B dynamic shared memory")
        kernels.append(entry)
    return {"nvcc": nvcc_version(nvcc), "arch": arch, "kernels": kernels}


def cmd_export(args) -> int:
    from autogen.export.writer import ExportRequest, export

    out = check_export_out(args.out)
    check_family_renders(get_family(args.family))  # a family that cannot render: its error, and nothing else
    _note_missing_db(args.db)
    result = export(ExportRequest(args.family, out, gpu=args.gpu, arch=args.arch, db_url=args.db,
                                  self_test=args.self_test, force=args.force))
    summary = result.summary()
    _note_passed_over(summary["gpu"], [(o["gpu"], o["shapes"]) for o in summary["also_tuned_on"]])
    for skipped in result.skipped:
        print(f"autogen: warning: skipped the stored {terminal_text(skipped)}", file=sys.stderr)
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

    check_storing_db(args.db, "db upgrade")
    revision = upgrade(args.db)
    print(f"database at revision {revision}")
    return 0


def _most_tuned(db_url, family, matches):
    """The (source, winner) among several GPUs' winners of one problem: the GPU with the most
    tuned shapes of the family (tuning_db.most_tuned_gpu, the rule export follows), noted on stderr."""
    from tuning_db import most_tuned_gpu

    gpus = {w.device.name for _, w in matches}
    found, _ = _winners(db_url, family=family.name)
    (first, *_), passed_over = most_tuned_gpu([w for _, w in found if w.device.name in gpus])
    _note_passed_over(first.device.name, passed_over)
    return next((s, w) for s, w in matches if w.device.name == first.device.name)


def _note_passed_over(chosen: str, passed_over) -> None:
    """One stderr line naming the GPUs a request matched but the rule passed over."""
    if passed_over:
        others = "; ".join(f"{terminal_text(name)!r} ({count} shapes)" for name, count in passed_over)
        print(f"autogen: note: chose {terminal_text(chosen)!r}, the GPU with the most tuned shapes; also tuned on "
              f"{others}: pick one with --gpu NAME", file=sys.stderr)


def _note_missing_db(db_url: str | None) -> None:
    """One stderr line where the --db file to read does not exist (it is not created: a read
    never writes), so that an empty answer is not taken for an empty database."""
    missing = missing_sqlite_file(db_url)
    if missing is not None:
        print(f"autogen: note: the database {terminal_text(missing)} does not exist (a read does not create it); "
              "only the shipped catalog is read", file=sys.stderr)


def _report_invalid(invalid) -> None:
    """One stderr line per stored row that cannot be read; the command goes on without it."""
    for row in invalid:
        print(f"autogen: warning: skipped invalid row {terminal_text(row.describe())}", file=sys.stderr)


def _local_gpu_name() -> str | None:
    try:
        from autogen.gpu.device import device_identity
        return device_identity().name
    except GpuUnavailableError:
        return None
