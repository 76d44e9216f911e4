"""Ingest ids scoped by node, and the OOM-kill and pressure-stop counters kept on the node (issue 37).

- ``reports``, ``events``, ``observations``: an ingest id is unique per node, not across the fleet
  (``UNIQUE (node_id, ingest_id)``, named ``uq_<table>_node_ingest``, in place of ``UNIQUE
  (ingest_id)``). Before, node B's report or event whose id happened to be node A's was answered
  ``{"stored": false}`` and dropped: a node's ids are its agent's own (a UUID, a spool file's
  name), and nothing makes two agents' ids differ. The writer's ``ON CONFLICT`` names the pair.
- ``nodes.oom_kills_total``, ``nodes.pressure_stops_total``: the node's exit events of each reason
  ever received, counted as each is stored (``store/writer``) and, here, from the events kept.
  ``oomguard_oom_kills_total`` and ``oomguard_pressure_stops_total`` read them, so those events
  now expire with the others at ``--retention`` (they were kept for ever, and a node could send
  any number of them) while the counters never go down.

On PostgreSQL the old constraint is found by reflection (``reports_ingest_id_key`` when 0001
made it) and dropped; the new one builds its index in one pass over the table, under a lock
that holds writes back meanwhile (as 0008's rewrite did). On SQLite a constraint is part of the
table's ``CREATE TABLE``: each table is copied (Alembic's batch "move and copy"), its unnamed
``UNIQUE (ingest_id)`` named by a naming convention so that it can be left out.

The downgrade puts the fleet-wide constraint back; it refuses, before it changes anything, while
two nodes hold the same id (delete all but one of them first).

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"

TABLES = ("reports", "events", "observations")
COUNTERS = (("oom_kills_total", "oom-kill"), ("pressure_stops_total", "pressure-stop"))
OLD_NAME = "uq_%(table_name)s_%(column_0_name)s"  # the name the batch gives SQLite's unnamed constraint


def _old_constraint(table: str) -> str | None:
    """The name of *table*'s ``UNIQUE (ingest_id)`` on this database (None: it has none); SQLite's
    unnamed one by the batch's naming convention."""
    for constraint in sa.inspect(op.get_bind()).get_unique_constraints(table):
        if constraint["column_names"] == ["ingest_id"]:
            return str(constraint["name"] or f"uq_{table}_ingest_id")
    return None


def upgrade() -> None:
    for table in TABLES:
        old = _old_constraint(table)
        with op.batch_alter_table(table, naming_convention={"uq": OLD_NAME}) as batch:
            if old is not None:
                batch.drop_constraint(old, type_="unique")
            batch.create_unique_constraint(f"uq_{table}_node_ingest", ["node_id", "ingest_id"])
    with op.batch_alter_table("nodes") as batch:  # NOT NULL with a constant default: a catalog change on PostgreSQL
        for column, _ in COUNTERS:
            batch.add_column(sa.Column(column, sa.BigInteger(), nullable=False, server_default="0"))
    for column, reason in COUNTERS:
        op.execute(
            f"UPDATE nodes SET {column} = (SELECT COUNT(*) FROM events e WHERE e.node_id = nodes.id "
            f"AND e.kind = 'exit' AND e.reason = '{reason}')"
        )


def _shared_ids() -> None:
    """RuntimeError, before anything changes, while an ingest id is held by two nodes or more (the
    fleet-wide constraint would refuse it halfway: SQLite's batch copy is not undone)."""
    bind = op.get_bind()
    for table in TABLES:
        shared = sa.text(
            f"SELECT COUNT(*) FROM (SELECT ingest_id FROM {table} GROUP BY ingest_id HAVING COUNT(*) > 1) s"
        )
        count = bind.execute(shared).scalar() or 0
        if count:
            raise RuntimeError(
                f"revision 0011's downgrade: {count} ingest id{'s' if count > 1 else ''} of {table} "
                f"{'are' if count > 1 else 'is'} held by more than one node; delete all but one of each first"
            )


def downgrade() -> None:
    _shared_ids()
    with op.batch_alter_table("nodes") as batch:
        for column, _ in reversed(COUNTERS):
            batch.drop_column(column)
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(f"uq_{table}_node_ingest", type_="unique")
            batch.create_unique_constraint(f"{table}_ingest_id_key", ["ingest_id"])
