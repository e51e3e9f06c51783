"""One winner per cache mode.

Revision ID: 0003
Revises: 0002
Create Date: 2025-03-10

Until now the winner key was (gpu, family, dtype, shape): a three-trial hot-cache run replaced a
forty-trial cold-cache winner of the same problem. autogen_winners gains ``cache_mode``, filled
from the winner's trial, and the unique key widens to include it, so the cold and the hot winner
of a problem are kept apart.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

WINNER_KEY_0002 = ["gpu_id", "family", "dtype", "shape_key"]


def upgrade() -> None:
    # On SQLite this rebuilds autogen_winners (row ids are copied). The old key allowed one winner
    # per problem, so filling cache_mode after widening the key cannot collide.
    with op.batch_alter_table("autogen_winners") as batch:
        batch.add_column(
            sa.Column("cache_mode", sa.String(8), nullable=False, server_default="cold")
        )
        batch.drop_constraint("uq_autogen_winners_key", type_="unique")
        batch.create_unique_constraint(
            "uq_autogen_winners_key", [*WINNER_KEY_0002, "cache_mode"]
        )
    op.execute(
        "UPDATE autogen_winners SET cache_mode = (SELECT t.cache_mode FROM autogen_trials t "
        "WHERE t.id = autogen_winners.trial_id) "
        "WHERE trial_id IN (SELECT id FROM autogen_trials)"
    )


def downgrade() -> None:
    # Revision 0002 holds one winner per problem: where a problem has both, the cold one stays.
    op.execute(
        "DELETE FROM autogen_winners WHERE cache_mode <> 'cold' AND EXISTS ("
        "SELECT 1 FROM autogen_winners AS cold WHERE cold.cache_mode = 'cold' "
        "AND cold.gpu_id = autogen_winners.gpu_id AND cold.family = autogen_winners.family "
        "AND cold.dtype = autogen_winners.dtype AND cold.shape_key = autogen_winners.shape_key)"
    )
    with op.batch_alter_table("autogen_winners") as batch:
        batch.drop_constraint("uq_autogen_winners_key", type_="unique")
        batch.create_unique_constraint("uq_autogen_winners_key", WINNER_KEY_0002)
        batch.drop_column("cache_mode")
