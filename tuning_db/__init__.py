"""Storage of autogen's tuning results: trials, winners and validations per GPU and shape.

Everything goes through TuningDB, which speaks only in the frozen records below.
"""

from tuning_db.records import (
    Claim,
    ClaimRecord,
    DeviceIdentity,
    InvalidRow,
    TrialRecord,
    ValidationRecord,
    WinnerRecord,
    one_per_problem,
)
from tuning_db.repository import (
    CorruptDatabaseError,
    DatabaseError,
    InvalidRowError,
    TuningDB,
    current_revision,
    default_url,
    upgrade,
)

__all__ = [
    "Claim",
    "ClaimRecord",
    "CorruptDatabaseError",
    "DatabaseError",
    "DeviceIdentity",
    "InvalidRow",
    "InvalidRowError",
    "TrialRecord",
    "TuningDB",
    "ValidationRecord",
    "WinnerRecord",
    "current_revision",
    "default_url",
    "one_per_problem",
    "upgrade",
]
