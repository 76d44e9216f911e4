"""A node speaks only for itself (issue 37, item 1): a failed run raises its class's floor only
where the node's own supervisor's exit event shows it.

- ``observations.confirmed``: true for a failed run (``oom-kill``, ``pressure-stop``) when an exit
  event of the same node, reason and agent time is stored (``store/claims.py``), set as either
  arrives. An unconfirmed failure is a sample, not a floor. Set here for the rows already stored
  by the same rule; ``ok`` rows are set true (they need no event).
- ``ix_events_node_agent_time`` (events: node, agent time) and ``ix_observations_node_observed``
  (observations: node, agent time): the lookups of that rule, one node's rows of one time.

NOT NULL with a constant default (false): a catalog change on PostgreSQL 11 and later, then one
UPDATE; on SQLite, ADD COLUMN.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    with op.batch_alter_table("observations") as batch:
        batch.add_column(sa.Column("confirmed", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_index("ix_events_node_agent_time", "events", ["node_id", "time"])
    op.create_index("ix_observations_node_observed", "observations", ["node_id", "observed"])
    op.execute(
        "UPDATE observations SET confirmed = TRUE WHERE outcome = 'ok' OR EXISTS (SELECT 1 FROM events e "
        "WHERE e.node_id = observations.node_id AND e.kind = 'exit' AND e.reason = observations.outcome "
        "AND e.time = observations.observed)"
    )


def downgrade() -> None:
    op.drop_index("ix_observations_node_observed", "observations")
    op.drop_index("ix_events_node_agent_time", "events")
    with op.batch_alter_table("observations") as batch:
        batch.drop_column("confirmed")
