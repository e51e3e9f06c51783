"""ORM tables of the tuning database (the schema at the head migration) and their records.

Only tuning_db.repository touches these rows; everyone else sees the frozen records in
tuning_db.records, which the ``to_record`` methods build. Every table is prefixed ``autogen_``
because Optuna or other tools may keep their own tables in the same database. Timestamps are
ISO-8601 UTC text of fixed width: they sort correctly and read back identically on every dialect.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import BigInteger, Float, ForeignKey, Index, MetaData, String, Text, UniqueConstraint, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tuning_db.records import DeviceIdentity, TrialRecord, ValidationRecord, WinnerRecord

# Explicit constraint names make SQLite batch migrations (which rebuild a table) able to find and
# drop a constraint, and give every dialect the same names.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
}

TIMESTAMP = String(32)  # "2025-01-31T12:00:00.000000+00:00"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class GpuRow(Base):
    """One GPU model; its software stack is recorded per trial, not here."""

    __tablename__ = "autogen_gpus"
    __table_args__ = (UniqueConstraint("name", "compute_capability", name="uq_autogen_gpus_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    compute_capability: Mapped[str] = mapped_column(String(16))
    sm_count: Mapped[int]
    l2_bytes: Mapped[int] = mapped_column(BigInteger)

    @staticmethod
    def values_of(device: DeviceIdentity) -> dict[str, Any]:
        return {
            "name": device.name,
            "compute_capability": device.compute_capability,
            "sm_count": device.sm_count,
            "l2_bytes": device.l2_bytes,
        }


# The conditions of the partial indexes on what a claim counts (autogen_claim_many's read, which
# states them as these constants, so the planner matches them).
COUNTED_TRIALS = "status <> 'rejected'"
RUNNING_CLAIMS = "state = 'running'"


class TrialRow(Base):
    """One measured, failed or rejected variant; a re-measurement replaces the row in place."""

    __tablename__ = "autogen_trials"
    __table_args__ = (
        UniqueConstraint(
            "gpu_id", "family", "dtype", "shape_key", "kernel_name", "cache_mode",
            name="uq_autogen_trials_key",
        ),
        # The trials a problem's budget counts (revision 0005), read under the claims' lock on
        # SQLite (PostgreSQL's claims read autogen_trial_counts instead: revision 0006).
        Index("ix_autogen_trials_counted", "gpu_id", "family", "dtype", "shape_key", "cache_mode",
              postgresql_where=text(COUNTED_TRIALS), sqlite_where=text(COUNTED_TRIALS)),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("autogen_gpus.id"))
    family: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(32))
    shape_key: Mapped[str] = mapped_column(String(256))
    kernel_name: Mapped[str] = mapped_column(String(256))
    params: Mapped[str] = mapped_column(Text)  # JSON object
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    time_us: Mapped[float | None] = mapped_column(Float)
    samples_us: Mapped[str] = mapped_column(Text)  # JSON list of floats
    error: Mapped[float | None] = mapped_column(Float)
    source_hash: Mapped[str] = mapped_column(String(64))
    compile_options: Mapped[str] = mapped_column(Text)
    driver_version: Mapped[int]
    runtime_version: Mapped[int]
    nvrtc_version: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[str] = mapped_column(TIMESTAMP)
    # Added by revision 0002; the server default fills rows written by revision 0001.
    cache_mode: Mapped[str] = mapped_column(String(8), server_default="cold")
    spread_us: Mapped[float | None] = mapped_column(Float)

    @staticmethod
    def values_of(device: DeviceIdentity, trial: TrialRecord) -> dict[str, Any]:
        """Column values of ``trial`` measured on ``device`` (without gpu_id and created_at)."""
        return {
            "family": trial.family,
            "dtype": trial.dtype,
            "shape_key": trial.shape_key,
            "kernel_name": trial.kernel_name,
            "cache_mode": trial.cache_mode,
            "params": json.dumps(trial.params, sort_keys=True),
            "status": trial.status,
            "reason": trial.reason,
            "time_us": trial.time_us,
            "samples_us": json.dumps([float(sample) for sample in trial.samples_us]),
            "spread_us": trial.spread_us,
            "error": trial.error,
            "source_hash": trial.source_hash,
            "compile_options": trial.compile_options,
            "driver_version": device.driver_version,
            "runtime_version": device.runtime_version,
            "nvrtc_version": device.nvrtc_version,
        }

    def to_record(self) -> TrialRecord:
        return TrialRecord(
            family=self.family,
            dtype=self.dtype,
            shape_key=self.shape_key,
            kernel_name=self.kernel_name,
            params=json.loads(self.params),
            status=self.status,
            reason=self.reason,
            time_us=self.time_us,
            samples_us=tuple(json.loads(self.samples_us)),
            spread_us=self.spread_us,
            error=self.error,
            source_hash=self.source_hash,
            compile_options=self.compile_options,
            cache_mode=self.cache_mode,
            created_at=self.created_at,
        )

    def device(self, gpu: GpuRow) -> DeviceIdentity:
        """The device as stored: the GPU row plus the software stack this trial ran on."""
        return DeviceIdentity(
            name=gpu.name,
            compute_capability=gpu.compute_capability,
            sm_count=gpu.sm_count,
            l2_bytes=gpu.l2_bytes,
            driver_version=self.driver_version,
            runtime_version=self.runtime_version,
            nvrtc_version=self.nvrtc_version,
        )


class WinnerRow(Base):
    """The served kernel of one problem on one GPU model, per cache mode (revision 0003)."""

    __tablename__ = "autogen_winners"
    __table_args__ = (
        UniqueConstraint(
            "gpu_id", "family", "dtype", "shape_key", "cache_mode", name="uq_autogen_winners_key"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("autogen_gpus.id"))
    family: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(32))
    shape_key: Mapped[str] = mapped_column(String(256))
    # Indexed because deleting trials makes the database look up winners by trial.
    trial_id: Mapped[int] = mapped_column(ForeignKey("autogen_trials.id"), index=True)
    peer_name: Mapped[str] = mapped_column(String(128))
    peer_time_us: Mapped[float | None] = mapped_column(Float)
    margin: Mapped[float | None] = mapped_column(Float)
    autogen_version: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[str] = mapped_column(TIMESTAMP)
    # Added by revision 0003 (filled from the winner's trial): always its trial's cache_mode.
    cache_mode: Mapped[str] = mapped_column(String(8), server_default="cold")

    def to_record(self, gpu: GpuRow, trial: TrialRow) -> WinnerRecord:
        return WinnerRecord(
            device=trial.device(gpu),
            trial=trial.to_record(),
            peer_name=self.peer_name,
            peer_time_us=self.peer_time_us,
            margin=self.margin,
            autogen_version=self.autogen_version,
            updated_at=self.updated_at,
        )


class ValidationRow(Base):
    """A kernel checked on a shape it was not tuned for (added by revision 0002)."""

    __tablename__ = "autogen_validations"
    __table_args__ = (
        UniqueConstraint(
            "gpu_id", "family", "dtype", "shape_key", "source_hash",
            name="uq_autogen_validations_key",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("autogen_gpus.id"))
    family: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(32))
    shape_key: Mapped[str] = mapped_column(String(256))
    source_hash: Mapped[str] = mapped_column(String(64))
    kernel_name: Mapped[str] = mapped_column(String(256))
    passed: Mapped[bool]
    error: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(TIMESTAMP)

    @staticmethod
    def values_of(validation: ValidationRecord) -> dict[str, Any]:
        """Column values of ``validation`` (without gpu_id and created_at)."""
        return {
            "family": validation.family,
            "dtype": validation.dtype,
            "shape_key": validation.shape_key,
            "source_hash": validation.source_hash,
            "kernel_name": validation.kernel_name,
            "passed": validation.passed,
            "error": validation.error,
            "reason": validation.reason,
        }

    def to_record(self) -> ValidationRecord:
        return ValidationRecord(
            family=self.family,
            dtype=self.dtype,
            shape_key=self.shape_key,
            kernel_name=self.kernel_name,
            source_hash=self.source_hash,
            passed=bool(self.passed),
            error=self.error,
            reason=self.reason,
            created_at=self.created_at,
        )


class ClaimRow(Base):
    """A variant being measured by one worker, or measured (revision 0004_trial_claims).

    Workers sharing a database claim a variant before compiling it: the unique key makes two
    workers on the same GPU model never measure the same variant. A running claim carries a
    lease (``expires_at``, seconds since the epoch on the database's clock) that its worker's
    heartbeat keeps extending; once it lapses (the worker died), another worker takes it over.
    ``variant`` is the hash of the variant's code with its name masked, so two parameter sets
    that render the same code are one variant.
    """

    __tablename__ = "autogen_claims"
    __table_args__ = (
        UniqueConstraint(
            "gpu_id", "family", "dtype", "shape_key", "cache_mode", "variant",
            name="uq_autogen_claims_key",
        ),
        # The running claims a problem's budget counts (revision 0005), read under its lock.
        Index("ix_autogen_claims_running", "gpu_id", "family", "dtype", "shape_key", "cache_mode",
              postgresql_where=text(RUNNING_CLAIMS), sqlite_where=text(RUNNING_CLAIMS)),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("autogen_gpus.id"))
    family: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(32))
    shape_key: Mapped[str] = mapped_column(String(256))
    cache_mode: Mapped[str] = mapped_column(String(8))
    variant: Mapped[str] = mapped_column(String(64))
    kernel_name: Mapped[str] = mapped_column(String(256))
    params: Mapped[str] = mapped_column(Text)  # JSON object
    owner: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))  # "running" | "done"
    expires_at: Mapped[float] = mapped_column(Float)
    attempts: Mapped[int]  # 1 + the number of take-overs
    created_at: Mapped[str] = mapped_column(TIMESTAMP)
    updated_at: Mapped[str] = mapped_column(TIMESTAMP)
