"""What this process asks of its databases: statements, transactions, rows written, and the time
spent in them, counted for every SQLAlchemy engine of the process (autogen's tables and Optuna's
storage alike). The search loop reports the difference over its run (autogen.search.loop), so a
tune's phases say how much of its wall time was the database's and how many round trips a trial
cost; scripts/sim_scale_out.py reads the same counters per worker process.

Cheap by design: two monotonic clock reads and a few additions per statement. The counters are
the process's (every thread's): two search loops of one process (several GPUs' owners) each see
the other's statements in their difference.

Lock waits: a SQLite writer takes the write lock at its BEGIN IMMEDIATE, a PostgreSQL writer at
its row lock (SELECT ... FOR UPDATE) or a claim at its problem's advisory lock; the time of those statements is counted apart as
``lock_wait_s``: time spent queueing behind other writers rather than working; ``lock_held_s``,
from the lock taken to its transaction's commit (or rollback) being sent: the section other writers
of the same lock queue behind, less the commit's own round trip (SQLAlchemy's commit event comes
before the commit).
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass

_installed = False
_install_lock = threading.Lock()


@dataclass
class DbCounts:
    statements: int = 0
    transactions: int = 0  # commits and rollbacks
    rows_written: int = 0  # rows inserted, updated or deleted
    statement_s: float = 0.0  # wall time inside statements (lock waits included)
    lock_wait_s: float = 0.0  # wall time of the statements that take a write lock
    lock_held_s: float = 0.0  # wall time from taking a write lock to the commit that frees it
    locked_transactions: int = 0  # transactions that took one
    row_lock_held_s: float = 0.0  # of which row locks (FOR UPDATE: the shared study's, the GPU row's)
    row_locked_transactions: int = 0

    def minus(self, earlier: "DbCounts") -> "DbCounts":
        return DbCounts(**{k: v - getattr(earlier, k) for k, v in asdict(self).items()})

    def as_phases(self) -> dict:
        """The search's phases keys: seconds as ``db_<what>`` and counts as ``db_<what>_n``."""
        return {"db_statements_n": self.statements, "db_transactions_n": self.transactions,
                "db_rows_written_n": self.rows_written, "db_statement": self.statement_s,
                "db_lock_wait": self.lock_wait_s, "db_lock_held": self.lock_held_s,
                "db_locked_transactions_n": self.locked_transactions, "db_row_lock_held": self.row_lock_held_s,
                "db_row_locked_transactions_n": self.row_locked_transactions}


_totals = DbCounts()
_totals_lock = threading.Lock()


def snapshot() -> DbCounts:
    """The process's counts so far (installing the counting on first use)."""
    install()
    with _totals_lock:
        return DbCounts(**asdict(_totals))


def _takes_lock(statement: str) -> bool:
    head = statement.lstrip()[:40].upper()
    return (head.startswith("BEGIN IMMEDIATE") or statement[-40:].upper().rstrip().endswith(("FOR UPDATE", "FOR NO KEY UPDATE"))
            or "pg_advisory_xact_lock" in statement)


def _writes(statement: str) -> bool:
    return statement.lstrip()[:7].upper() in ("INSERT ", "UPDATE ", "DELETE ")


def install() -> None:
    """Count every engine's statements in this process from now on (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        @event.listens_for(Engine, "before_cursor_execute")
        def before(conn, _cursor, _statement, _parameters, context, _executemany) -> None:
            if context is not None:
                context._autogen_began = time.monotonic()

        @event.listens_for(Engine, "after_cursor_execute")
        def after(conn, cursor, statement, _parameters, context, _executemany) -> None:
            began = getattr(context, "_autogen_began", None)
            spent = 0.0 if began is None else time.monotonic() - began
            written = max(cursor.rowcount, 0) if _writes(statement) else 0
            locks = _takes_lock(statement)
            if locks:  # held from here to the transaction's end (ended)
                conn.info.setdefault("_autogen_locked_at", time.monotonic())
                conn.info["_autogen_row_lock"] = conn.info.get("_autogen_row_lock") or "FOR " in statement[-30:].upper()
            with _totals_lock:
                _totals.statements += 1
                _totals.statement_s += spent
                _totals.rows_written += written
                if locks:
                    _totals.lock_wait_s += spent

        def ended(conn) -> None:
            locked_at = conn.info.pop("_autogen_locked_at", None)
            row_lock = conn.info.pop("_autogen_row_lock", False)
            with _totals_lock:
                _totals.transactions += 1
                if locked_at is not None:
                    held = time.monotonic() - locked_at
                    _totals.lock_held_s += held
                    _totals.locked_transactions += 1
                    if row_lock:
                        _totals.row_lock_held_s += held
                        _totals.row_locked_transactions += 1

        event.listen(Engine, "commit", ended)
        event.listen(Engine, "rollback", ended)
        _installed = True
