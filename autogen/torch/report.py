"""tune-model's results: one row per problem, the decode step's estimate per batch, as a table, JSON
or a self-contained HTML page (inline SVG, no script, nothing fetched). No torch."""

from __future__ import annotations

import html

from autogen.report import render_table, terminal_text


def model_rows(plan, documents: list[dict]) -> list[dict]:
    """One row per problem of `plan` (autogen.torch.models.DecodePlan), from the tune summaries
    (autogen.report.tune_summary) in the same order as plan.problems."""
    rows = []
    for problem, document in zip(plan.problems, documents):
        winner = document.get("winner") or {}
        rows.append({"problem": str(problem), "roles": plan.roles(problem), "per_step": plan.per_step(problem),
                     "batch": next(i.batch for i in plan.items if i.problem == problem),
                     "kernel": winner.get("kernel"), "time_us": winner.get("time_us"),
                     "torch_us": winner.get("peer_time_us"), "peer": winner.get("peer"),
                     "speedup": winner.get("speedup_vs_peer"), "pct_of_floor": winner.get("pct_of_floor"),
                     "no_winner": document.get("no_winner")})
    return rows


def step_estimates(plan, rows: list[dict]) -> list[dict]:
    """Per batch: the sum over the step's problems of (times per step x time), autogen's and
    PyTorch's; None where a problem has no time (no winner, or no PyTorch peer measured)."""
    by_problem = {row["problem"]: row for row in rows}
    steps = []
    for batch in plan.batches:
        items = [i for i in plan.items if i.batch == batch]
        ours = _total(items, by_problem, "time_us")
        theirs = _total(items, by_problem, "torch_us")
        steps.append({"batch": batch, "problems": len({i.problem for i in items}),
                      "launches": sum(i.count for i in items),
                      "autogen_us": None if ours is None else round(ours, 2),
                      "torch_us": None if theirs is None else round(theirs, 2),
                      "speedup": round(theirs / ours, 3) if ours and theirs else None})
    return steps


def _total(items, by_problem: dict, key: str) -> float | None:
    values = [by_problem[str(i.problem)][key] for i in items]
    if not items or any(v is None for v in values):
        return None
    return sum(i.count * v for i, v in zip(items, values))


HEADER = ("problem", "roles", "per step", "kernel", "time us", "PyTorch us", "speedup", "% of floor")


def model_table(plan, rows: list[dict], steps: list[dict]) -> str:
    """The text table tune-model prints."""
    cells = [[row["problem"], ", ".join(row["roles"]), str(row["per_step"]),
              row["kernel"] or f"none ({row['no_winner'] or 'not tuned'})", _number(row["time_us"], 2),
              _number(row["torch_us"], 2), _times(row["speedup"]), _number(row["pct_of_floor"], 1)] for row in rows]
    lines = [render_table([HEADER, *cells])]  # render_table makes each cell safe for a terminal
    model = plan.model
    lines.append("")
    lines.append(f"decode step of {terminal_text(model.name)} ({model.architecture}, {model.layers} layers, "
                 f"{plan.dtype}): the problems above, times per step x time; attention, norms and the rest "
                 "are not counted")
    for step in steps:
        lines.append(f"  batch {step['batch']}: autogen {_number(step['autogen_us'], 1)} us, PyTorch "
                     f"{_number(step['torch_us'], 1)} us, speedup {_times(step['speedup'])} "
                     f"({step['launches']} launches of {step['problems']} problems)")
    lines += [f"note: {terminal_text(note)}" for note in plan.notes]
    return "\n".join(lines)


def _number(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _times(value) -> str:
    return "-" if value is None else f"{value:.3f}x"


# --- the HTML page ------------------------------------------------------------------------------

BAR_HEIGHT, LABEL_WIDTH, CHART_WIDTH = 22, 330, 420


def bar_chart(title: str, bars: list[tuple[str, float | None, str]], reference: float | None, unit: str) -> str:
    """A horizontal bar chart as inline SVG: (label, value, colour class) per bar, a dashed line
    at `reference` (1.0x, 100%), values printed at the bar's end; a missing value shows as '-'."""
    known = [v for _, v, _ in bars if v is not None]
    top = max(known + ([reference] if reference else []) + [1e-9]) * 1.15
    height = BAR_HEIGHT * len(bars) + 30
    scale = CHART_WIDTH / top
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{LABEL_WIDTH + CHART_WIDTH + 70}" '
             f'height="{height}" aria-label="{html.escape(title)}">']
    for index, (label, value, css) in enumerate(bars):
        y = 10 + index * BAR_HEIGHT
        parts.append(f'<text x="{LABEL_WIDTH - 6}" y="{y + 15}" text-anchor="end">{html.escape(label)}</text>')
        if value is None:
            parts.append(f'<text x="{LABEL_WIDTH + 4}" y="{y + 15}">-</text>')
            continue
        width = max(1.0, value * scale)
        parts.append(f'<rect class="{css}" x="{LABEL_WIDTH}" y="{y + 3}" width="{width:.1f}" height="{BAR_HEIGHT - 6}"/>')
        parts.append(f'<text x="{LABEL_WIDTH + width + 4:.1f}" y="{y + 15}">{value:.3g}{html.escape(unit)}</text>')
    if reference:
        x = LABEL_WIDTH + reference * scale
        parts.append(f'<line class="ref" x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{height - 16}"/>')
        parts.append(f'<text x="{x:.1f}" y="{height - 3}" text-anchor="middle">{reference:g}{html.escape(unit)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


STYLE = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}
td.n{text-align:right}svg text{font-size:12px;fill:#222}.win{fill:#2a7d3f}.loss{fill:#c0392b}
.floor{fill:#3465a4}.none{fill:#999}.ref{stroke:#555;stroke-dasharray:4 3}"""


def html_page(title: str, intro: str, sections: list[tuple[str, str]]) -> str:
    """A self-contained page: (heading, HTML) sections; `intro` is text (escaped here)."""
    body = "\n".join(f"<h2>{html.escape(heading)}</h2>\n{content}" for heading, content in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body><h1>{html.escape(title)}</h1>\n<p>{html.escape(intro)}</p>\n"
            f"{body}\n</body></html>\n")


def html_table(header: tuple[str, ...], rows: list[list[object]]) -> str:
    def cell(value) -> str:
        numeric = isinstance(value, (int, float))
        return f'<td class="n">{value}</td>' if numeric else f"<td>{html.escape('-' if value is None else str(value))}</td>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    return f"<table><tr>{head}</tr>\n" + "\n".join("<tr>" + "".join(map(cell, row)) + "</tr>" for row in rows) + "</table>"


def model_report_html(plan, rows: list[dict], steps: list[dict], gpu: str | None) -> str:
    """tune-model --report: speedup over PyTorch per problem, each kernel's % of its floor, the step."""
    labels = [f"{row['problem']} ({', '.join(row['roles'])})" for row in rows]
    speedups = [(label, row["speedup"], _speed_class(row["speedup"])) for label, row in zip(labels, rows)]
    floors = [(label, row["pct_of_floor"], "floor" if row["pct_of_floor"] is not None else "none")
              for label, row in zip(labels, rows)]
    step_bars = [(f"decode step, batch {s['batch']}", s["speedup"], _speed_class(s["speedup"])) for s in steps]
    table = html_table(HEADER, [[row["problem"], ", ".join(row["roles"]), row["per_step"], row["kernel"],
                                 row["time_us"], row["torch_us"], row["speedup"], row["pct_of_floor"]] for row in rows])
    model = plan.model
    intro = (f"{model.name}: {model.architecture}, {model.layers} layers, {plan.dtype}, batches "
             f"{', '.join(map(str, plan.batches))}" + (f", on {gpu}" if gpu else "") +
             ". Times are each kernel's and PyTorch's, measured in the same run (CUDA-graph replays); the step "
             "sums times per step x time over these problems only (attention, norms and the rest not counted).")
    return html_page(f"autogen tune-model: {model.name}", intro, [
        ("Speedup over PyTorch per problem (green: autogen faster)", bar_chart("speedup", speedups, 1.0, "x")),
        ("Each kernel's share of its floor (bytes over the measured copy bandwidth)",
         bar_chart("% of floor", floors, 100.0, "%")),
        ("Decode step estimate", bar_chart("step speedup", step_bars, 1.0, "x")),
        ("Table", table),
    ])


def _speed_class(speedup: float | None) -> str:
    if speedup is None:
        return "none"
    return "win" if speedup >= 1.0 else "loss"
