"""A memory consumer's own view beside the kernel's (issue 34, item 4: ``agent --cuzk-status``).

- ``nodes.consumers``: the latest report's ``consumers`` list as kept (a JSON list of ``{name,
  budget_bytes, used_bytes, available_bytes}``; NULL: the report had none, as an older agent's),
  exported as ``oomguard_consumer_budget_bytes`` and ``oomguard_consumer_used_bytes``;
- ``nodes.consumer_budget_bytes``: the largest budget among them (NULL: none known), which the
  ``consumer-budget-above-limit`` alert compares with ``effective_bytes`` in SQL.

Nullable, no default: an instant catalog change on PostgreSQL, ADD COLUMN on SQLite. Nodes show
them from their next report.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"

NEW_COLUMNS = (("consumers", sa.Text), ("consumer_budget_bytes", sa.BigInteger))


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        for name, kind in NEW_COLUMNS:
            batch.add_column(sa.Column(name, kind()))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        for name, _ in reversed(NEW_COLUMNS):
            batch.drop_column(name)
