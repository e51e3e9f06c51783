"""Claims decided on the server (PostgreSQL).

Revision ID: 0005_claim_function
Revises: 0004_trial_claims
Create Date: 2026-11-27

PostgreSQL gains the function autogen_claim_many (tuning_db.migrations.functions): a batch of
claims is locked, read, decided and written in one call, so the problem's lock is held for no
client round trip. No table changes; nothing happens on SQLite, whose claims are decided in Python
under the file's write lock.
"""

from __future__ import annotations

from alembic import op

from tuning_db.migrations.functions import create_functions, drop_functions

revision = "0005_claim_function"
down_revision = "0004_trial_claims"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_functions(op.get_bind())


def downgrade() -> None:
    drop_functions(op.get_bind())
