"""The first schema: nodes, reports (limits and budget), events.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("first_seen_ms", sa.BigInteger, nullable=False),
        sa.Column("last_seen_ms", sa.BigInteger, nullable=False),
        sa.Column("latest_report", sa.Text),
        sa.Column("effective_bytes", sa.BigInteger),
        sa.Column("host_total_bytes", sa.BigInteger),
        sa.Column("budget_bytes", sa.BigInteger),
        sa.Column("limited_by", sa.String(16)),
        sa.Column("runtime", sa.String(32)),
        sa.Column("memlock_soft_bytes", sa.BigInteger),
        sa.Column("warnings", sa.Text),
    )
    op.create_table(
        "reports",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
        sa.Column("ingest_id", sa.String(128), nullable=False, unique=True),
        sa.Column("received_ms", sa.BigInteger, nullable=False),
        sa.Column("effective_bytes", sa.BigInteger),
        sa.Column("budget_bytes", sa.BigInteger),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
        sa.Column("ingest_id", sa.String(128), nullable=False, unique=True),
        sa.Column("received_ms", sa.BigInteger, nullable=False),
        sa.Column("time", sa.String(64)),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(16)),
        sa.Column("exit_code", sa.Integer),
        sa.Column("signal", sa.Integer),
        sa.Column("budget_bytes", sa.BigInteger),
        sa.Column("concurrency", sa.Integer),
        sa.Column("peak_bytes", sa.BigInteger),
        sa.Column("duration_s", sa.Float),
        sa.Column("body", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("reports")
    op.drop_table("nodes")
