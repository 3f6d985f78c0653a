"""The SQL framework's tables: high-water marks, idempotency keys, skipped transactions.

Revision ID: waltz_0001
Revises:
Create Date: 2025-01-01

The first revision of the ``waltz`` branch (branch label ``waltz``). Its ID is prefixed so that it
cannot collide with an application's revision IDs when our versions directory is added to the
application's ``version_locations``. The tables are written out in full (not imported from
``waltz.jdbc_style.schema``): a migration is a snapshot of its time.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "waltz_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("waltz",)
depends_on: str | Sequence[str] | None = None

_NAME_LENGTH = 190


def upgrade() -> None:
    """Create the three framework tables."""
    op.create_table(
        "waltz_high_water_marks",
        sa.Column("cluster_name", sa.String(_NAME_LENGTH), nullable=False),
        sa.Column("partition_id", sa.Integer(), nullable=False),
        sa.Column("high_water_mark", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("cluster_name", "partition_id", name="pk_waltz_high_water_marks"),
    )
    op.create_table(
        "waltz_idempotency_keys",
        sa.Column("cluster_name", sa.String(_NAME_LENGTH), nullable=False),
        sa.Column("idempotency_key", sa.String(_NAME_LENGTH), nullable=False),
        sa.Column("partition_id", sa.Integer(), nullable=False),
        sa.Column("transaction_id", sa.BigInteger(), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("cluster_name", "idempotency_key", name="pk_waltz_idempotency_keys"),
    )
    op.create_table(
        "waltz_skipped_transactions",
        sa.Column("cluster_name", sa.String(_NAME_LENGTH), nullable=False),
        sa.Column("partition_id", sa.Integer(), nullable=False),
        sa.Column("transaction_id", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("operator", sa.String(_NAME_LENGTH), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("skipped_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint(
            "cluster_name", "partition_id", "transaction_id", name="pk_waltz_skipped_transactions"
        ),
    )


def downgrade() -> None:
    """Drop the three framework tables (their rows, the high-water marks included, are lost)."""
    op.drop_table("waltz_skipped_transactions")
    op.drop_table("waltz_idempotency_keys")
    op.drop_table("waltz_high_water_marks")
