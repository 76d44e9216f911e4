"""The fleet learns (issue 23): ``observations``, what each run of a profiled worker really used
per job and for its baseline, at which concurrency, and how it ended (``ok``, ``oom-kill``,
``pressure-stop``), indexed by profile and time, and by profile, class and time (the recommender's reads), and by
node and time
(forgetting a node, and a node's own samples).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.create_table(
        "observations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", ondelete="CASCADE"), nullable=False),
        sa.Column("ingest_id", sa.String(128), nullable=False, unique=True),
        sa.Column("received_ms", sa.BigInteger, nullable=False),
        sa.Column("observed", sa.String(64), nullable=False),
        sa.Column("profile", sa.String(128), nullable=False),
        sa.Column("node_class", sa.String(64), nullable=False),
        sa.Column("declared_per_job_bytes", sa.BigInteger, nullable=False),
        sa.Column("peak_per_job_bytes", sa.BigInteger, nullable=False),
        sa.Column("declared_baseline_bytes", sa.BigInteger, nullable=False),
        sa.Column("peak_baseline_bytes", sa.BigInteger),
        sa.Column("concurrency", sa.Integer, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
    )
    op.create_index("ix_observations_profile_time", "observations", ["profile", "received_ms"])
    op.create_index("ix_observations_class_time", "observations", ["profile", "node_class", "received_ms"])
    op.create_index("ix_observations_node_time", "observations", ["node_id", "received_ms"])


def downgrade() -> None:
    op.drop_index("ix_observations_node_time", "observations")
    op.drop_index("ix_observations_class_time", "observations")
    op.drop_index("ix_observations_profile_time", "observations")
    op.drop_table("observations")
