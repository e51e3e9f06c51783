"""The pre-tuned catalog shipped with autogen: winners tuned on our GPUs, as legible JSON.

At first use the catalog is loaded into a SQLite file in the user's cache directory (named by the
catalog's hash, so a new release builds a new one) and queried like any tuning database; where
that folder cannot be written, into an in-memory database (said once on stderr). The dispatcher
asks the user's own database first, so local tuning always takes precedence.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path

from tuning_db import DatabaseError, TuningDB
from tuning_db.records import DeviceIdentity, TrialRecord

from .notes import note_once

CATALOG_DIR = Path(__file__).resolve().parent / "data"
FORMAT = 1


def catalog_files() -> list[Path]:
    return sorted(CATALOG_DIR.glob("pretuned_*.json"))


def dump_catalog(db: TuningDB, gpu_name: str, path: Path) -> int:
    """Write every winner stored for `gpu_name` to a catalog file; returns the entry count."""
    entries = []
    for winner in db.winners(gpu_name=gpu_name):
        trial = dataclasses.asdict(winner.trial)
        trial["samples_us"] = list(trial["samples_us"])
        entries.append({"device": dataclasses.asdict(winner.device), "trial": trial,
                        "peer_name": winner.peer_name, "peer_time_us": winner.peer_time_us,
                        "margin": winner.margin, "autogen_version": winner.autogen_version})
    entries.sort(key=lambda e: (e["trial"]["family"], e["trial"]["dtype"], e["trial"]["shape_key"]))
    path.write_text(json.dumps({"format": FORMAT, "entries": entries}, indent=1, sort_keys=True) + "\n")
    return len(entries)


def load_catalog(db: TuningDB, path: Path) -> int:
    document = json.loads(path.read_text())
    if document.get("format") != FORMAT:
        raise ValueError(f"{path}: unsupported catalog format {document.get('format')!r}")
    for entry in document["entries"]:
        device = DeviceIdentity(**entry["device"])
        trial = dict(entry["trial"], samples_us=tuple(entry["trial"]["samples_us"]))
        stored = db.record_trial(device, TrialRecord(**trial))
        db.set_winner(device, stored, peer_name=entry["peer_name"], peer_time_us=entry["peer_time_us"],
                      margin=entry["margin"], autogen_version=entry["autogen_version"])
    return len(document["entries"])


@functools.lru_cache(maxsize=1)
def pretuned_db() -> TuningDB | None:
    """The shipped catalog as a (cached) database, or None when autogen ships none."""
    files = catalog_files()
    if not files or os.environ.get("AUTOGEN_NO_PRETUNED"):
        return None
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autogen"
    path = cache / f"pretuned-{digest}.db"
    if not path.exists():
        building = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            db = TuningDB(f"sqlite:///{building}")
            for file in files:
                load_catalog(db, file)
            db.close()
            os.replace(building, path)  # atomic: concurrent first uses never see half a catalog
        except (DatabaseError, OSError) as exc:  # the cache folder cannot be written
            for leftover in (building, Path(f"{building}-wal"), Path(f"{building}-shm")):
                try:
                    leftover.unlink(missing_ok=True)
                except OSError:
                    pass
            note_once(("pretuned", str(cache)), f"cannot cache the pre-tuned catalog in {cache} "
                      f"({getattr(exc, 'strerror', None) or exc}); it is loaded in memory for this process")
            db = TuningDB("sqlite://")  # in memory, shared by every thread of this process
            for file in files:
                load_catalog(db, file)
            return db
    return TuningDB(f"sqlite:///{path}", readonly=True)  # served only: never written again
