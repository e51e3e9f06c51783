"""Turning results into the stdout table and the --json document."""

from __future__ import annotations

import json


def performance(time_us: float | None, bytes_moved: int, flops: int, copy_gbs: float | None,
                peer_time_us: float | None, roofline: str = "memory", fp32_tflops: float | None = None) -> dict:
    """GB/s, TFLOP/s, the share of the roofline floor (bytes over the measured copy bandwidth
    for a memory-bound family, flops over the measured FP32 peak for a compute-bound one) and
    the speedup over the peer, for one time."""
    if time_us is None:
        return {}
    seconds = time_us * 1e-6
    if roofline == "compute":
        floor = flops / (fp32_tflops * 1e12) * 1e6 if fp32_tflops and flops else None
    else:
        floor = bytes_moved / (copy_gbs * 1e9) * 1e6 if copy_gbs else None
    return {
        "time_us": round(time_us, 4),
        "gb_per_s": round(bytes_moved / seconds / 1e9, 1),
        "tflop_per_s": round(flops / seconds / 1e12, 3) if flops else None,
        "roofline": roofline,
        "floor_us": round(floor, 4) if floor else None,
        "pct_of_floor": round(100.0 * floor / time_us, 1) if floor else None,
        "peer_time_us": round(peer_time_us, 4) if peer_time_us else None,
        "speedup_vs_peer": round(peer_time_us / time_us, 3) if peer_time_us else None,
    }


def tune_summary(result) -> dict:
    winner = result.winner
    doc = {
        "problem": {"family": result.problem.family, "dtype": result.problem.dtype, "shape": result.problem.shape},
        "gpu": result.device.name,
        "arch": result.device.arch,
        "copy_bandwidth_gb_per_s": round(result.copy_gbs, 1) if result.copy_gbs else None,
        "fp32_peak_tflop_per_s": round(result.fp32_tflops, 2) if result.fp32_tflops else None,
        "bytes_moved": result.bytes_moved,
        "trials": {"measured": result.measured, "failed": result.failed, "rejected": result.rejected,
                   "reused": result.reused, "worker_restarts": result.worker_restarts,
                   "taken_over": getattr(result, "taken_over", 0)},
        "gpus": list(getattr(result, "gpus", ())),
        "wall_s": round(result.wall_s, 2),
        "phases_s": result.phases_s,
        "database": result.db_url,
        "winner": None,
    }
    if winner is None:
        doc["no_winner"] = getattr(result, "no_winner", "") or "no variant passed validation"
    else:
        doc["winner"] = {
            "kernel": winner.trial.kernel_name,
            "params": winner.trial.params,
            "spread_us": round(winner.trial.spread_us or 0.0, 4),
            "margin_to_runner_up": round(winner.margin, 4) if winner.margin is not None else None,
            "peer": winner.peer_name or None,
            **performance(winner.trial.time_us, result.bytes_moved, result.flops, result.copy_gbs,
                          winner.peer_time_us, result.roofline, result.fp32_tflops),
        }
        doc["finalists"] = [{"kernel": t.kernel_name, "time_us": round(t.time_us, 4),
                             "spread_us": round(t.spread_us or 0.0, 4)} for t in result.candidates]
    return doc


def render_table(rows: list[tuple]) -> str:
    """Rows of cells (a label and its value, or more), each column as wide as its widest cell;
    the last cell of a row is not padded, nor counted (a short row's message runs on); None
    shows as "-"."""
    texts = [[_text(cell) for cell in row] for row in rows]
    widths = [max((len(row[i]) for row in texts if len(row) > i + 1), default=0)
              for i in range(max((len(row) for row in texts), default=0))]
    return "\n".join("  ".join(cell if i == len(row) - 1 else cell.ljust(widths[i]) for i, cell in enumerate(row))
                     for row in texts)


def tune_table(doc: dict) -> str:
    problem = doc["problem"]
    rows: list[tuple[str, object]] = [
        ("problem", f"{problem['family']} {problem['dtype']} " + " ".join(f"{k}={v}" for k, v in problem["shape"].items())),
        ("gpu", f"{doc['gpu']} ({doc['arch']})"),
    ]
    winner = doc["winner"]
    if winner is None:
        rows.append(("winner", "none: " + doc.get("no_winner", "no variant passed validation")))
    else:
        rows += [
            ("winner", winner["kernel"]),
            ("parameters", " ".join(f"{k}={v}" for k, v in winner["params"].items())),
            ("time", f"{winner['time_us']:.3f} us (spread {winner['spread_us']:.3f} us)"),
            ("bandwidth", f"{winner['gb_per_s']:.1f} GB/s"),
            ("TFLOP/s", f"{winner['tflop_per_s']:.2f}" if winner.get("tflop_per_s") else "-"),
            ("% of floor", _pct(winner, doc)),
            ("peer", _peer(winner)),
        ]
    trials = doc["trials"]
    rows += [
        ("trials", f"{trials['measured']} measured, {trials['failed']} failed, {trials['rejected']} rejected, "
                   f"{trials['reused']} reused" + (f", {trials['worker_restarts']} worker restarts"
                                                   if trials["worker_restarts"] else "")),
        ("wall time", f"{doc['wall_s']:.1f} s"),
        ("stored in", doc["database"]),
    ]
    return render_table(rows)


def _pct(winner: dict, doc: dict) -> str:
    pct = winner.get("pct_of_floor")
    if winner.get("roofline") == "compute":
        if pct is None:
            return "n/a (FP32 peak not measured)"
        return f"{pct:.1f}% (floor at the measured FP32 peak {doc['fp32_peak_tflop_per_s']:.1f} TFLOP/s)"
    if pct is None:
        return "n/a (copy bandwidth not measured)"
    return f"{pct:.1f}% (floor at the measured copy bandwidth {doc['copy_bandwidth_gb_per_s']:.0f} GB/s)"


def _peer(winner: dict) -> str:
    if not winner.get("peer"):
        return "unavailable"
    return f"{winner['peer']} {winner['peer_time_us']:.3f} us -> speedup {winner['speedup_vs_peer']:.2f}x"


def _text(value) -> str:
    # Tables show what a database says (kernel names, GPU names, URLs): never raw on a terminal.
    return "-" if value is None else terminal_text(value)


def to_json(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=False)


def terminal_text(value: object) -> str:
    """Text from a database or an error made safe for a terminal: control characters (ANSI
    escapes included) and other non-printing characters are shown escaped, never interpreted."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
