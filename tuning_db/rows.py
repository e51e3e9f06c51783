"""Rows to records, checking every value: what the schema at hand holds, and how a stored row
becomes a TrialRecord or WinnerRecord, or an InvalidRow that says why it cannot (tuning_db.repository
reports those rather than raising from the middle of a listing)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import inspect, literal, null
from sqlalchemy.engine import Connection

from tuning_db import migrations
from tuning_db.engine import (
    DatabaseError,
    display_url,
    _not_ours,
    UPGRADE_HINT,
)
from tuning_db.models import Base, ClaimRow, GpuRow, TrialRow, ValidationRow, WinnerRow
from tuning_db.records import (
    DeviceIdentity,
    InvalidRow,
    TrialRecord,
    WinnerRecord,
)



TRIAL_STATUSES = ("ok", "failed", "rejected")
CACHE_MODES = ("cold", "hot")
# "m=16384,n=16": name=size pairs. Families check their own dimension names, order and ranges.
SHAPE_KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=(?:[0-9]+|[A-Za-z_][A-Za-z0-9_]*)(?:,[A-Za-z_][A-Za-z0-9_]*=(?:[0-9]+|[A-Za-z_][A-Za-z0-9_]*))*")



# -- what the schema at hand holds ----------------------------------------------------------------

# Columns that older schemas lack and readers can do without: (table, column) -> stand-in.
# autogen_winners.cache_mode (revision 0003) is its trial's, which _winner_columns supplies.
_STAND_INS: dict[tuple[str, str], Callable[[], Any]] = {
    (TrialRow.__tablename__, "cache_mode"): lambda: literal("cold"),  # revision 0002
    (TrialRow.__tablename__, "spread_us"): null,  # revision 0002
    (WinnerRow.__tablename__, "cache_mode"): lambda: None,  # revision 0003
}
_OPTIONAL_TABLES = frozenset({ValidationRow.__tablename__,  # revision 0002
                              ClaimRow.__tablename__})  # revision 0004_trial_claims


@dataclass(frozen=True)
class _Schema:
    """The autogen tables and columns a database holds; ``tables`` None means the head schema."""

    tables: frozenset[str] | None
    columns: Mapping[str, frozenset[str]] = field(default_factory=dict)
    revision: str | None = None

    def has_table(self, model: type[Base]) -> bool:
        return self.tables is None or model.__tablename__ in self.tables

    def has_column(self, model: type[Base], name: str) -> bool:
        return self.tables is None or name in self.columns.get(model.__tablename__, ())

    def column(self, model: type[Base], name: str):
        """The column, or what stands in for it where this (older) schema lacks it."""
        if self.has_column(model, name):
            return getattr(model, name)
        return _STAND_INS[(model.__tablename__, name)]()


_HEAD = _Schema(None)
_EMPTY = _Schema(frozenset())


def _read_schema(connection: Connection, url: str) -> _Schema:
    """What a database opened read-only holds. A new (empty) database reads as empty; another
    application's, or one autogen cannot read, is refused with what to do."""
    try:
        migrations.check_ownership(connection)
    except migrations.ForeignDatabaseError as exc:
        raise _not_ours(display_url(url), exc, url) from exc
    inspector = inspect(connection)
    ours = frozenset(name for name in inspector.get_table_names() if name.startswith("autogen_"))
    if not ours:
        return _EMPTY
    revision = migrations.stamped_revision(connection)
    where = display_url(url)
    if not migrations.is_known_revision(revision):
        raise DatabaseError(
            f"{where}: its schema revision {revision} is unknown to this autogen (whose newest "
            f"is {migrations.head_revision()}): a newer autogen wrote it",
            url,
        )
    columns = {name: frozenset(c["name"] for c in inspector.get_columns(name)) for name in ours}
    lacking = []
    for table in Base.metadata.sorted_tables:
        if table.name not in ours:
            if table.name not in _OPTIONAL_TABLES:
                lacking.append(f"table {table.name}")
            continue
        lacking += [
            f"column {table.name}.{c.name}" for c in table.columns
            if c.name not in columns[table.name] and (table.name, c.name) not in _STAND_INS
        ]
    if lacking:
        raise DatabaseError(
            f"{where} is at schema revision {revision} and lacks {', '.join(lacking)}, so this "
            f"autogen cannot read it as it is: {UPGRADE_HINT} --db {where}",
            url,
        )
    return _Schema(ours, columns, revision)


# -- rows to records, checking every value --------------------------------------------------------


class _Malformed(Exception):
    """A stored value that cannot go into a record; the message says which and why."""


def _labeled(schema: _Schema, model: type[Base], prefix: str, **stand_ins) -> list:
    columns = []
    for column in model.__table__.columns:
        if column.name in stand_ins and not schema.has_column(model, column.name):
            expression = stand_ins[column.name]
        else:
            expression = schema.column(model, column.name)
        columns.append(expression.label(prefix + column.name))
    return columns


def _winner_mode(schema: _Schema):
    """A winner's cache mode: its own column, or (before revision 0003) its trial's."""
    if schema.has_column(WinnerRow, "cache_mode"):
        return WinnerRow.cache_mode
    return schema.column(TrialRow, "cache_mode")


def _trial_columns(schema: _Schema) -> list:
    return _labeled(schema, TrialRow, "t_")


def _winner_columns(schema: _Schema) -> list:
    return (
        _labeled(schema, WinnerRow, "w_", cache_mode=_winner_mode(schema))
        + _labeled(schema, GpuRow, "g_")
        + _trial_columns(schema)
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def _text(mapping: Mapping, key: str, what: str) -> str:
    value = mapping[key]
    if not isinstance(value, str):
        raise _Malformed(f"{what}={_short(value)} is not text")
    return value


def _integer(mapping: Mapping, key: str, what: str) -> int:
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Malformed(f"{what}={_short(value)} is not an integer")
    return value


def _number(value: object, what: str, *, positive: bool = False, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _Malformed(f"{what}={_short(value)} is not " + ("a positive time" if positive else "a number"))
    if positive and value <= 0:
        raise _Malformed(f"{what}={_short(value)} is not a positive time")
    return float(value)


def _json(mapping: Mapping, key: str, what: str) -> Any:
    text = mapping[key]
    if not isinstance(text, str):
        raise _Malformed(f"{what} are not JSON text but {_short(text)}")
    try:
        return json.loads(text)
    except ValueError:
        raise _Malformed(f"{what} are not JSON: {_short(text)}") from None


def _shape_key(mapping: Mapping, key: str) -> str:
    value = mapping[key]
    if not isinstance(value, str) or not SHAPE_KEY_PATTERN.fullmatch(value):
        raise _Malformed(f"bad shape key {_short(value)}: expected name=size pairs separated by commas")
    return value


def _choice(mapping: Mapping, key: str, what: str, allowed: tuple[str, ...]) -> str:
    value = mapping[key]
    if value not in allowed:
        raise _Malformed(f"{what}={_short(value)} is not one of {', '.join(allowed)}")
    return value


def _trial_record(m: Mapping, p: str = "t_") -> TrialRecord:
    """The trial in the ``p``-prefixed columns of ``m``; _Malformed naming the first bad value."""
    params = _json(m, p + "params", "params")
    if not isinstance(params, dict):
        raise _Malformed(f"params are not a mapping but a JSON {_JSON_TYPES.get(type(params), 'value')}")
    status = _choice(m, p + "status", "status", TRIAL_STATUSES)
    ok = status == "ok"
    samples = _json(m, p + "samples_us", "samples_us")
    if not isinstance(samples, list):
        raise _Malformed(f"samples_us are not a JSON array but {_short(samples)}")
    return TrialRecord(
        family=_text(m, p + "family", "family"),
        dtype=_text(m, p + "dtype", "dtype"),
        shape_key=_shape_key(m, p + "shape_key"),
        kernel_name=_text(m, p + "kernel_name", "kernel_name"),
        params=params,
        status=status,
        reason=_text(m, p + "reason", "reason"),
        time_us=_number(m[p + "time_us"], "time_us", positive=ok, optional=not ok),
        samples_us=tuple(_number(s, "a sample in samples_us", optional=False) for s in samples),
        spread_us=_number(m[p + "spread_us"], "spread_us"),
        error=_number(m[p + "error"], "error"),
        source_hash=_text(m, p + "source_hash", "source_hash"),
        compile_options=_text(m, p + "compile_options", "compile_options"),
        cache_mode=_choice(m, p + "cache_mode", "cache_mode", CACHE_MODES),
        created_at=_text(m, p + "created_at", "created_at"),
    )


def _device_record(m: Mapping) -> DeviceIdentity:
    """The GPU row (g_) with the software stack of the trial (t_) it is read with."""
    return DeviceIdentity(
        name=_text(m, "g_name", "GPU name"),
        compute_capability=_text(m, "g_compute_capability", "compute_capability"),
        sm_count=_integer(m, "g_sm_count", "sm_count"),
        l2_bytes=_integer(m, "g_l2_bytes", "l2_bytes"),
        driver_version=_integer(m, "t_driver_version", "driver_version"),
        runtime_version=_integer(m, "t_runtime_version", "runtime_version"),
        nvrtc_version=_text(m, "t_nvrtc_version", "nvrtc_version"),
    )


def _winner_record(m: Mapping) -> WinnerRecord:
    if m["g_id"] is None:
        raise _Malformed(f"its GPU (autogen_gpus row {m['w_gpu_id']!r}) is missing")
    if m["t_id"] is None:
        raise _Malformed(f"its trial (autogen_trials row {m['w_trial_id']!r}) is missing")
    try:
        trial = _trial_record(m)
        device = _device_record(m)
    except _Malformed as exc:
        raise _Malformed(f"its trial (autogen_trials row {m['t_id']!r}): {exc}") from None
    if trial.status != "ok":
        raise _Malformed(f"its trial (autogen_trials row {m['t_id']!r}) has status "
                         f"{trial.status!r}; only an ok trial can win")
    stored_as = (m["w_gpu_id"], m["w_family"], m["w_dtype"], m["w_shape_key"], m["w_cache_mode"])
    trial_is = (m["t_gpu_id"], trial.family, trial.dtype, trial.shape_key, trial.cache_mode)
    if stored_as != trial_is:
        raise _Malformed(f"it is stored as the winner of {_short(stored_as[1:])} but its trial "
                         f"(autogen_trials row {m['t_id']!r}) is of {_short(trial_is[1:])}")
    return WinnerRecord(
        device=device,
        trial=trial,
        peer_name=_text(m, "w_peer_name", "peer_name"),
        peer_time_us=_number(m["w_peer_time_us"], "peer_time_us", positive=True),
        margin=_number(m["w_margin"], "margin"),
        autogen_version=_text(m, "w_autogen_version", "autogen_version"),
        updated_at=_text(m, "w_updated_at", "updated_at"),
    )


def _invalid_winner(m: Mapping, reason: str) -> InvalidRow:
    return InvalidRow(WinnerRow.__tablename__, m["w_id"], reason, gpu=m["g_name"],
                      family=m["w_family"], dtype=m["w_dtype"], shape_key=m["w_shape_key"],
                      cache_mode=m["w_cache_mode"])


def _invalid_trial(m: Mapping, reason: str) -> InvalidRow:
    return InvalidRow(TrialRow.__tablename__, m["t_id"], reason, gpu=m.get("g_name"),
                      family=m["t_family"], dtype=m["t_dtype"], shape_key=m["t_shape_key"],
                      cache_mode=m["t_cache_mode"])


def _sorted_checked(rows, build, invalid) -> tuple[list, list[InvalidRow]]:
    records, bad = [], []
    for row in rows:
        mapping = row._mapping
        try:
            records.append(build(mapping))
        except _Malformed as exc:
            bad.append(invalid(mapping, str(exc)))
    return records, bad


