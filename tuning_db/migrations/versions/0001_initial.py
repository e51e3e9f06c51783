"""Initial schema: GPUs, trials (one per kernel, cold cache only) and winners.

Revision ID: 0001
Revises:
Create Date: 2025-01-06

Written out by hand rather than from the models, so that it keeps describing the schema as it was
when later revisions change the models.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _key_columns() -> list[sa.Column]:
    """The problem a row belongs to: GPU model, kernel family, dtype and shape."""
    return [
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("shape_key", sa.String(256), nullable=False),
    ]


def _gpu_foreign_key(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["gpu_id"], ["autogen_gpus.id"], name=f"fk_{table}_gpu_id_autogen_gpus"
    )


def upgrade() -> None:
    op.create_table(
        "autogen_gpus",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("compute_capability", sa.String(16), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.Column("l2_bytes", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_autogen_gpus"),
        sa.UniqueConstraint("name", "compute_capability", name="uq_autogen_gpus_key"),
    )
    op.create_table(
        "autogen_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        *_key_columns(),
        sa.Column("kernel_name", sa.String(256), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("time_us", sa.Float(), nullable=True),
        sa.Column("samples_us", sa.Text(), nullable=False),
        sa.Column("error", sa.Float(), nullable=True),
        sa.Column("source_hash", sa.String(64), nullable=False),
        sa.Column("compile_options", sa.Text(), nullable=False),
        sa.Column("driver_version", sa.Integer(), nullable=False),
        sa.Column("runtime_version", sa.Integer(), nullable=False),
        sa.Column("nvrtc_version", sa.String(32), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_autogen_trials"),
        _gpu_foreign_key("autogen_trials"),
        sa.UniqueConstraint(
            "gpu_id", "family", "dtype", "shape_key", "kernel_name", name="uq_autogen_trials_key"
        ),
    )
    op.create_table(
        "autogen_winners",
        sa.Column("id", sa.Integer(), nullable=False),
        *_key_columns(),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("peer_name", sa.String(128), nullable=False),
        sa.Column("peer_time_us", sa.Float(), nullable=True),
        sa.Column("margin", sa.Float(), nullable=True),
        sa.Column("autogen_version", sa.String(64), nullable=False),
        sa.Column("updated_at", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_autogen_winners"),
        _gpu_foreign_key("autogen_winners"),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["autogen_trials.id"], name="fk_autogen_winners_trial_id_autogen_trials"
        ),
        sa.UniqueConstraint(
            "gpu_id", "family", "dtype", "shape_key", name="uq_autogen_winners_key"
        ),
    )
    op.create_index("ix_autogen_winners_trial_id", "autogen_winners", ["trial_id"])


def downgrade() -> None:
    op.drop_index("ix_autogen_winners_trial_id", table_name="autogen_winners")
    op.drop_table("autogen_winners")
    op.drop_table("autogen_trials")
    op.drop_table("autogen_gpus")
