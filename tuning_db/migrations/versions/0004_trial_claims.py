"""Claims: workers sharing a database measure each variant once.

Revision ID: 0004_trial_claims
Revises: 0003
Create Date: 2025-03-20

New table autogen_claims: one row per (gpu, family, dtype, shape, cache mode, variant), inserted
by the worker about to measure the variant and kept alive by its heartbeat (a lease); a lapsed
lease lets another worker take the variant over. No existing table changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_trial_claims"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autogen_claims",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_id", sa.Integer(), nullable=False),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("shape_key", sa.String(256), nullable=False),
        sa.Column("cache_mode", sa.String(8), nullable=False),
        sa.Column("variant", sa.String(64), nullable=False),
        sa.Column("kernel_name", sa.String(256), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.String(32), nullable=False),
        sa.ForeignKeyConstraint(["gpu_id"], ["autogen_gpus.id"],
                                name="fk_autogen_claims_gpu_id_autogen_gpus"),
        sa.PrimaryKeyConstraint("id", name="pk_autogen_claims"),
        sa.UniqueConstraint("gpu_id", "family", "dtype", "shape_key", "cache_mode", "variant",
                            name="uq_autogen_claims_key"),
    )


def downgrade() -> None:
    op.drop_table("autogen_claims")
