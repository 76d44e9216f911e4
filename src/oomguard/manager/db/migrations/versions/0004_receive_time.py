"""Receive time rules: the agent's own time of each report beside the manager's receive time,
and each node's clock skew (agent time minus receive time, of its latest report); and where the
last retention pass's thinning ended (``retention_state``), so the next pass starts there.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    # Nullable, no default: an instant catalog change on PostgreSQL, ADD COLUMN on SQLite.
    with op.batch_alter_table("reports") as batch:
        batch.add_column(sa.Column("agent_ms", sa.BigInteger))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("clock_skew_ms", sa.BigInteger))
    op.create_table(
        "retention_state",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("value_ms", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("retention_state")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("clock_skew_ms")
    with op.batch_alter_table("reports") as batch:
        batch.drop_column("agent_ms")
