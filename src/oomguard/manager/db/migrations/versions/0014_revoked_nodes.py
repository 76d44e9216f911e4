"""Per-node revocation (issue 39, item 7): ``revoked_nodes``, the nodes whose tokens are revoked.

One node's token could not be revoked without rotating every node's (the fleet secret). A node in
this table gets 403 for every write of it (its own token's or the fleet-wide one's) and for a read
with its token, on every replica within a second (each reads the table every second).

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"


def upgrade() -> None:
    op.create_table(
        "revoked_nodes",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("revoked_ms", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.String(500)),
    )


def downgrade() -> None:
    op.drop_table("revoked_nodes")
