"""The budget's count kept as trials are written (PostgreSQL).

Revision ID: 0006_trial_counts
Revises: 0005_claim_function
Create Date: 2026-12-02

PostgreSQL gains the table autogen_trial_counts, filled from the trials stored, and statement
triggers on autogen_trials that keep it (tuning_db.migrations.functions); autogen_claim_many
reads a problem's stored trials there rather than counting them row by row under the problem's
lock, which took longer the more trials the problem held. SQLite is unchanged (its claims keep
counting: an index read without visiting the table).
"""

from __future__ import annotations

from alembic import op

from tuning_db.migrations.functions import (
    CLAIM_MANY,
    COUNTED_BY_SCAN,
    claim_many_sql,
    create_claim_function,
    create_trial_counts,
    drop_trial_counts,
)

revision = "0006_trial_counts"
down_revision = "0005_claim_function"
branch_labels = None
depends_on = None


def upgrade() -> None:
    connection = op.get_bind()
    if connection.dialect.name == "postgresql":
        create_trial_counts(connection)
        create_claim_function(connection, CLAIM_MANY)


def downgrade() -> None:
    connection = op.get_bind()
    if connection.dialect.name == "postgresql":
        create_claim_function(connection, claim_many_sql(COUNTED_BY_SCAN))
        drop_trial_counts(connection)
