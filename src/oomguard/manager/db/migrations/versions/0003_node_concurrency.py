"""The planned concurrency of a node (from an agent with plan flags), for the dashboard.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("concurrency", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("concurrency")
