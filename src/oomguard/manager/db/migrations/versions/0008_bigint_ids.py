"""64-bit row ids for the tables that grow with every report and event: ``reports``, ``events``
and ``observations``. Their ids were PostgreSQL ``serial`` (32-bit: at most 2,147,483,647), and
retention thins rows without reusing ids: 100,000 nodes at the default 30 s interval insert 288 M
reports a day, so ingest would stop after about 7.5 days ("nextval: reached maximum value of
sequence"). On SQLite an ``INTEGER PRIMARY KEY`` is the 64-bit rowid already (SQLite docs,
"ROWIDs and the INTEGER PRIMARY KEY"): nothing to change.

On PostgreSQL the column becomes ``bigint`` (``ALTER TABLE ... ALTER COLUMN ... TYPE`` rewrites the
table and its indexes under an exclusive lock, as ``VACUUM FULL`` does; not timed here) and its
sequence ``AS bigint``, which also raises the sequence's maximum, as it was the old type's
maximum (PostgreSQL docs, "ALTER SEQUENCE": "Changing the data type automatically changes the
minimum and maximum values of the sequence if and only if the previous minimum and maximum
values were the minimum or maximum value of the old data type").

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"

TABLES = ("reports", "events", "observations")


def _retype(kind: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN id TYPE {kind}")
        sequence = bind.execute(sa.text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": table}).scalar()
        if sequence is not None:
            op.execute(f"ALTER SEQUENCE {sequence} AS {kind}")


def upgrade() -> None:
    _retype("bigint")


def downgrade() -> None:
    _retype("integer")  # refused by PostgreSQL when an id is past the 32-bit range
