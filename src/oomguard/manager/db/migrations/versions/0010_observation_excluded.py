"""An operator excludes one observation from what the fleet learns (issue 36, item 2: outliers
kept but shown, and removable one at a time, not only by forgetting their node).

- ``observations.excluded``: true once an operator excluded the observation
  (``POST /api/v1/observations/{node}/{id}/exclude``; ``.../include`` sets it back). The
  recommender's reads (``store/learned.samples_of``) leave such rows out; the profile page still
  lists them, marked.

NOT NULL with a constant default (false): the rows already stored are all included. On
PostgreSQL (11 and later) a constant default is a catalog change, no table rewrite ("ALTER
TABLE", "When a column is added with ADD COLUMN and a non-volatile DEFAULT is specified, the
default is evaluated at the time of the statement and the result stored in the table's
metadata"); on SQLite, ADD COLUMN.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    with op.batch_alter_table("observations") as batch:
        batch.add_column(sa.Column("excluded", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("observations") as batch:
        batch.drop_column("excluded")
