"""Hot-cache trials, sample spread and nearest-shape validations.

Revision ID: 0002
Revises: 0001
Create Date: 2025-02-03

* autogen_trials gains ``cache_mode`` ("cold" for every existing row) and ``spread_us``; the
  unique key widens to include cache_mode, so a kernel can hold a cold and a hot measurement.
* New table autogen_validations: one row per (gpu, family, dtype, shape, source hash).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TRIAL_KEY_0001 = ["gpu_id", "family", "dtype", "shape_key", "kernel_name"]


def upgrade() -> None:
    # On SQLite this rebuilds autogen_trials; row ids are copied, so winners keep their trials.
    with op.batch_alter_table("autogen_trials") as batch:
        batch.add_column(
            sa.Column("cache_mode", sa.String(8), nullable=False, server_default="cold")
        )
        batch.add_column(sa.Column("spread_us", sa.Float(), nullable=True))
        batch.drop_constraint("uq_autogen_trials_key", type_="unique")
        batch.create_unique_constraint("uq_autogen_trials_key", [*TRIAL_KEY_0001, "cache_mode"])

    op.create_table(
        "autogen_validations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("shape_key", sa.String(256), nullable=False),
        sa.Column("source_hash", sa.String(64), nullable=False),
        sa.Column("kernel_name", sa.String(256), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_autogen_validations"),
        sa.ForeignKeyConstraint(
            ["gpu_id"], ["autogen_gpus.id"], name="fk_autogen_validations_gpu_id_autogen_gpus"
        ),
        sa.UniqueConstraint(
            "gpu_id", "family", "dtype", "shape_key", "source_hash",
            name="uq_autogen_validations_key",
        ),
    )


def downgrade() -> None:
    op.drop_table("autogen_validations")
    # Revision 0001 holds one trial per kernel: hot measurements (and winners chosen from them)
    # have no place there and are dropped.
    hot_trials = "SELECT id FROM autogen_trials WHERE cache_mode <> 'cold'"
    op.execute(f"DELETE FROM autogen_winners WHERE trial_id IN ({hot_trials})")
    op.execute("DELETE FROM autogen_trials WHERE cache_mode <> 'cold'")
    with op.batch_alter_table("autogen_trials") as batch:
        batch.drop_constraint("uq_autogen_trials_key", type_="unique")
        batch.create_unique_constraint("uq_autogen_trials_key", TRIAL_KEY_0001)
        batch.drop_column("spread_us")
        batch.drop_column("cache_mode")
