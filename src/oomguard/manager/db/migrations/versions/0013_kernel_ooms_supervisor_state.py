"""Every OOM kill and every supervisor's state (issue 38, items 1 and 2).

- ``nodes.kernel_oom_kill``, ``nodes.kernel_oom_source``: the kernel's ``oom_kill`` counter of the
  node's group as its latest report read it, and the counter's file; ``nodes.kernel_oom_kills_total``:
  the kills the counter's rises add up to (``store/kernel_ooms.py``): 0 here, and each node's next
  report's counter is counted whole, as a first report's is (the reports kept hold no counter).
- ``events.kills``: a ``kernel-oom`` row's kills (one row per rise of the counter, dated by the
  report that saw it).
- ``nodes.supervisor_state``: the supervisor's state by its latest lifecycle event (``running``,
  ``exited``, ``restarting``, ``gave-up``, ``stopped``, ``refused``, ``starting``), set here from
  the events kept, then by the writer as each arrives.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"

STATE = (
    "CASE e.kind WHEN 'start' THEN 'running' WHEN 'exit' THEN 'exited' WHEN 'restart' THEN 'restarting' "
    "WHEN 'give-up' THEN 'gave-up' WHEN 'stop' THEN 'stopped' "
    "WHEN 'gate' THEN (CASE WHEN n2.refused_ms IS NOT NULL THEN 'refused' ELSE 'starting' END) END"
)


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("kernel_oom_kill", sa.BigInteger()))
        batch.add_column(sa.Column("kernel_oom_source", sa.String(512)))
        batch.add_column(sa.Column("kernel_oom_kills_total", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("supervisor_state", sa.String(16)))
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("kills", sa.BigInteger()))
    op.execute(
        f"UPDATE nodes SET supervisor_state = (SELECT {STATE} FROM events e JOIN nodes n2 ON n2.id = e.node_id "
        "WHERE e.node_id = nodes.id AND e.kind IN ('start', 'exit', 'restart', 'give-up', 'stop', 'gate') "
        "ORDER BY e.received_ms DESC, e.id DESC LIMIT 1)"
    )


def downgrade() -> None:
    with op.batch_alter_table("events") as batch:
        batch.drop_column("kills")
    with op.batch_alter_table("nodes") as batch:
        for column in ("supervisor_state", "kernel_oom_kills_total", "kernel_oom_source", "kernel_oom_kill"):
            batch.drop_column(column)
