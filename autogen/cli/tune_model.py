"""`autogen tune-model CONFIG`: tune every decode-time problem of a model, print one table.

CONFIG is a Hugging Face config.json (or its folder) or a preset name (autogen.torch.models).
The problems are tuned exactly as `autogen tune` tunes them (the same options, --gpus, resuming
from the database), so the winners are what autogen.torch.patch and the dispatcher serve.
"""

from __future__ import annotations

from pathlib import Path

from autogen.cli.options import check_storing_db, check_tune_options
from autogen.cli.tuning import tune_documents
from autogen.errors import UsageError
from autogen.report import to_json
from autogen.torch.models import decode_plan, load_model
from autogen.torch.report import model_report_html, model_rows, model_table, step_estimates


def cmd_tune_model(args) -> int:
    plan = decode_plan(load_model(args.config), args.batch, args.dtype)
    report = _report_path(args.report) if args.report else None
    check_tune_options(args)
    check_storing_db(args.db, "tune-model")
    documents = tune_documents(args, plan.problems, tables=False)
    rows = model_rows(plan, documents)
    steps = step_estimates(plan, rows)
    gpu = next((d["gpu"] for d in documents if d.get("gpu")), None)
    if args.json:
        print(to_json({"model": plan.model.name, "architecture": plan.model.architecture, "dtype": plan.dtype,
                       "gpu": gpu, "problems": rows, "steps": steps, "notes": list(plan.notes)}))
    else:
        print(model_table(plan, rows, steps))
    if report is not None:
        report.write_text(model_report_html(plan, rows, steps, gpu), encoding="utf-8")
    return 0 if all(row["kernel"] for row in rows) else 1


def _report_path(text: str) -> Path:
    """--report FILE: checked before any tuning, so a bad path wastes no GPU time."""
    path = Path(text)
    if path.is_dir():
        raise UsageError(f"--report {text} is a folder; give a file name such as report.html")
    if not path.parent.is_dir():
        raise UsageError(f"--report {text}: the folder {path.parent} does not exist")
    return path
