"""The pre-tuned catalog shipped with autogen: winners tuned on our GPUs, as legible JSON.

The catalog is read straight from autogen/data/pretuned_*.json into records; it is never copied
into a database, so reading it writes nothing anywhere. The dispatcher asks the user's own
database first, so local tuning always takes precedence; `autogen list`, `show` and `export` see
it too, marked as shipped. Each entry keeps the time it was tuned.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from pathlib import Path

from tuning_db import one_per_problem
from tuning_db.records import DeviceIdentity, TrialRecord, WinnerRecord
from tuning_db.rows import _device_record, _Malformed, _number, _text, _trial_record

from autogen.paths import write_atomically
from autogen.report import terminal_text

CATALOG_DIR = Path(__file__).resolve().parent / "data"
FORMAT = 1
SHIPPED = "shipped catalog"  # how list/show/export name where such a winner comes from


def catalog_files() -> list[Path]:
    return sorted(CATALOG_DIR.glob("pretuned_*.json"))


def dump_catalog(db, gpu_name: str, path: Path, keep: bool = False) -> int:
    """Write every winner stored for `gpu_name` in `db` (one database, or several: a list) to a
    catalog file; returns the entry count. The bench scripts of several families each fill a
    database on the GPU; one catalog per GPU gathers them. With `keep`, the entries already in
    the file that no database replaces (same family, dtype, shape and cache mode) stay."""
    entries = []
    for source in (db if isinstance(db, (list, tuple)) else [db]):
        for winner in source.winners(gpu_name=gpu_name):
            trial = dataclasses.asdict(winner.trial)
            trial["samples_us"] = list(trial["samples_us"])
            entries.append({"device": dataclasses.asdict(winner.device), "trial": trial,
                            "peer_name": winner.peer_name, "peer_time_us": winner.peer_time_us,
                            "margin": winner.margin, "autogen_version": winner.autogen_version,
                            "updated_at": winner.updated_at})
    def key(entry: dict) -> tuple:
        return entry["trial"]["family"], entry["trial"]["dtype"], entry["trial"]["shape_key"], entry["trial"]["cache_mode"]

    if keep and Path(path).exists():
        replaced = {key(e) for e in entries}
        entries += [e for e in json.loads(Path(path).read_text())["entries"] if key(e) not in replaced]
    entries.sort(key=key)
    write_atomically(path, json.dumps({"format": FORMAT, "entries": entries}, indent=1, sort_keys=True) + "\n")
    return len(entries)


def load_catalog(path: Path) -> list[WinnerRecord]:
    """The winners of one catalog file, with the times they were tuned. Each entry is checked as a
    database row is (tuning_db.rows); a file that is not a catalog of this format, and the entries
    that cannot become records, are skipped with one warning for the file: a damaged catalog
    never stops a command, it only serves less."""
    try:
        entries = _catalog_entries(Path(path))
    except _Malformed as exc:
        _warn(path, f"skipped the whole file: {exc}")
        return []
    winners, skipped = [], []
    for number, entry in enumerate(entries):
        try:
            winners.append(_catalog_winner(entry))
        except _Malformed as exc:
            skipped.append(f"entry {number}: {exc}")
    if skipped:
        more = f"; and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        _warn(path, f"skipped {len(skipped)} of its {len(entries)} entries ({skipped[0]}{more})")
    return winners


def _warn(path: Path, message: str) -> None:
    print(f"autogen: warning: shipped catalog {terminal_text(str(path))}: {terminal_text(message)}",
          file=sys.stderr)


def _catalog_entries(path: Path) -> list:
    """The entries of a catalog file; _Malformed when it cannot be read as one."""
    try:
        document = json.loads(path.read_bytes())
    except OSError as exc:
        raise _Malformed(f"cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:  # truncated, empty, not UTF-8, not JSON
        raise _Malformed(f"it is not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise _Malformed("it is not a JSON object")
    if document.get("format") != FORMAT:
        raise _Malformed(f"unsupported catalog format {document.get('format')!r} (this autogen reads {FORMAT})")
    if not isinstance(document.get("entries"), list):
        raise _Malformed("its entries are not a JSON array")
    return document["entries"]


_ENTRY_FIELDS = frozenset({"device", "trial", "peer_name", "peer_time_us", "margin", "autogen_version", "updated_at"})
_TRIAL_FIELDS = frozenset(f.name for f in dataclasses.fields(TrialRecord))
_DEVICE_FIELDS = frozenset(f.name for f in dataclasses.fields(DeviceIdentity))
_GPU_COLUMNS = ("name", "compute_capability", "sm_count", "l2_bytes")  # the rest are the trial's


def _catalog_winner(entry: object) -> WinnerRecord:
    """A catalog entry as a WinnerRecord, every value checked by the database's row checks."""
    entry = _fields(entry, _ENTRY_FIELDS, "the entry", optional={"updated_at"})
    trial = _fields(entry["trial"], _TRIAL_FIELDS, "its trial")
    device = _fields(entry["device"], _DEVICE_FIELDS, "its device")
    # The columns a database row would hold, so the same checks judge both.
    row = {"t_" + name: value for name, value in trial.items()}
    row.update(t_params=json.dumps(trial["params"]), t_samples_us=json.dumps(trial["samples_us"]))
    row.update({("g_" if name in _GPU_COLUMNS else "t_") + name: value for name, value in device.items()})
    record = _trial_record(row)
    if record.status != "ok":
        raise _Malformed(f"its trial has status {record.status!r}; only an ok trial can win")
    return WinnerRecord(device=_device_record(row), trial=record,
                        peer_name=_text(entry, "peer_name", "peer_name"),
                        peer_time_us=_number(entry["peer_time_us"], "peer_time_us", positive=True),
                        margin=_number(entry["margin"], "margin"),
                        autogen_version=_text(entry, "autogen_version", "autogen_version"),
                        updated_at=_text(entry, "updated_at", "updated_at") if entry.get("updated_at")
                        else record.created_at)


def _fields(value: object, names: frozenset[str], what: str, optional: set[str] = frozenset()) -> dict:
    if not isinstance(value, dict):
        raise _Malformed(f"{what} is not a JSON object")
    missing = sorted(names - optional - value.keys())
    unknown = sorted(value.keys() - names)
    if missing or unknown:
        raise _Malformed(f"{what} " + "; ".join(
            part for part in (missing and f"lacks {', '.join(missing)}",
                              unknown and f"has unknown field(s) {', '.join(map(str, unknown))}") if part))
    return value


class ShippedCatalog:
    """The catalog's winners, answering the read queries a TuningDB answers."""

    url = SHIPPED

    def __init__(self, winners: list[WinnerRecord]):
        self._winners = sorted(winners, key=lambda w: (w.device.name, w.device.compute_capability, w.trial.family,
                                                      w.trial.dtype, w.trial.shape_key))

    def winners(self, *, family: str | None = None, gpu_name: str | None = None,
                compute_capability: str | None = None, dtype: str | None = None, shape_key: str | None = None,
                cache_mode: str | None = None) -> list[WinnerRecord]:
        wanted = {"family": family, "dtype": dtype, "shape_key": shape_key, "cache_mode": cache_mode}
        return [w for w in self._winners
                if all(v is None or getattr(w.trial, k) == v for k, v in wanted.items())
                and (gpu_name is None or w.device.name == gpu_name)
                and (compute_capability is None or w.device.compute_capability == compute_capability)]

    def winners_checked(self, **filters) -> tuple[list[WinnerRecord], list]:
        """As TuningDB.winners_checked: invalid entries were left out (and warned of) on loading."""
        return self.winners(**filters), []

    def winner(self, device: DeviceIdentity, family: str, dtype: str, shape_key: str,
               cache_mode: str | None = None) -> WinnerRecord | None:
        found = one_per_problem(self.winners(family=family, gpu_name=device.name, dtype=dtype, shape_key=shape_key,
                                             compute_capability=device.compute_capability, cache_mode=cache_mode))
        return found[0] if found else None

    def close(self) -> None:
        pass


def pretuned_db() -> ShippedCatalog | None:
    """The shipped catalog (cached per process), or None when autogen ships none or
    $AUTOGEN_NO_PRETUNED is set. The variable is read on every call, so a "none" cached while it
    was set is never served after it is unset."""
    return None if os.environ.get("AUTOGEN_NO_PRETUNED") else _shipped_catalog()


@functools.lru_cache(maxsize=1)
def _shipped_catalog() -> ShippedCatalog | None:
    files = catalog_files()
    return ShippedCatalog([w for file in files for w in load_catalog(file)]) if files else None


pretuned_db.cache_clear = _shipped_catalog.cache_clear  # tests reload a changed catalog


class WithCatalog:
    """A user's database and the shipped catalog read as one: a problem tuned in the user's
    database hides the catalog's entry for it. Answers winners() like a TuningDB."""

    def __init__(self, db):
        self.db = db
        self.url = db.url
        self.catalog = pretuned_db()

    def labelled_winners(self, **filters) -> tuple[list[tuple[str, WinnerRecord]], list]:
        """((source, winner) pairs, the user database's invalid rows): source is "database" or
        "shipped"; malformed rows are reported, never raised."""
        mine, invalid = self.db.winners_checked(**filters)
        found = [("database", w) for w in mine]
        found += [("shipped", w) for w in untuned_shipped(self.catalog, mine, **filters)]
        return found, invalid


def untuned_shipped(catalog: ShippedCatalog | None, tuned: list[WinnerRecord], **filters) -> list[WinnerRecord]:
    """The catalog's winners matching `filters` whose problem (GPU, family, dtype, shape, cache
    mode) none of the user's `tuned` winners holds: a problem the user tuned hides its entry."""
    shipped = catalog.winners(**filters) if catalog is not None else []
    if not shipped:
        return []
    seen = {_problem_key(w) for w in tuned}
    return [w for w in shipped if _problem_key(w) not in seen]


def _problem_key(winner: WinnerRecord) -> tuple:
    return (winner.device.name, winner.device.compute_capability, winner.trial.family, winner.trial.dtype,
            winner.trial.shape_key, winner.trial.cache_mode)
