"""Claims decided on the server (PostgreSQL).

Revision ID: 0005_claim_function
Revises: 0004_trial_claims
Create Date: 2026-11-27

PostgreSQL gains the function autogen_claim_many (tuning_db.migrations.functions): a batch of
claims is locked, read, decided and written in one call, so the problem's lock is held for no
client round trip (SQLite's claims stay decided in Python under the file's write lock). Both gain
partial indexes on what the claim's read counts, a problem's trials that are not rejected and its
running claims, which it otherwise walked row by row under the lock.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tuning_db.migrations.functions import COUNTED_BY_SCAN, claim_many_sql, create_claim_function, drop_functions
from tuning_db.models import COUNTED_TRIALS, RUNNING_CLAIMS

revision = "0005_claim_function"
down_revision = "0004_trial_claims"
branch_labels = None
depends_on = None


PROBLEM = ["gpu_id", "family", "dtype", "shape_key", "cache_mode"]
INDEXES = (("ix_autogen_trials_counted", "autogen_trials", COUNTED_TRIALS),
           ("ix_autogen_claims_running", "autogen_claims", RUNNING_CLAIMS))


def upgrade() -> None:
    for name, table, condition in INDEXES:
        op.create_index(name, table, PROBLEM, postgresql_where=sa.text(condition), sqlite_where=sa.text(condition))
    create_claim_function(op.get_bind(), claim_many_sql(COUNTED_BY_SCAN))  # as it was: 0006 replaces it


def downgrade() -> None:
    drop_functions(op.get_bind())
    for name, table, _condition in INDEXES:
        op.drop_index(name, table_name=table)
