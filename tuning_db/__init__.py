"""Storage of autogen's tuning results: trials, winners and validations per GPU and shape.

Everything goes through TuningDB, which speaks only in the frozen records below. The names are
loaded on first use (PEP 562): the GPU worker and the compile processes need the records only,
not SQLAlchemy and Alembic, whose import would lengthen their start-up.
"""

from __future__ import annotations

import importlib

_RECORDS = ("Claim", "ClaimRecord", "DeviceIdentity", "InvalidRow", "TrialRecord", "ValidationRecord", "WinnerRecord",
            "most_tuned_gpu", "one_per_problem")
_ENGINE = ("CorruptDatabaseError", "DatabaseError", "InvalidRowError", "current_revision", "default_url", "upgrade")
_REPOSITORY = ("TuningDB",)

__all__ = sorted(_RECORDS + _ENGINE + _REPOSITORY)


def __getattr__(name: str):
    if name in _RECORDS:
        module = importlib.import_module("tuning_db.records")
    elif name in _ENGINE:
        module = importlib.import_module("tuning_db.engine")
    elif name in _REPOSITORY:
        module = importlib.import_module("tuning_db.repository")
    else:
        raise AttributeError(f"module 'tuning_db' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value
