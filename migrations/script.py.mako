"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

A revision of the SQL framework's own tables (waltz.jdbc_style.schema): keep schema.py and this
file in step, and write the tables out in full here (never import schema.py: a migration is a
snapshot of its time).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}

# revision identifiers, used by Alembic.
revision: str = ${repr(up_revision)}
down_revision: str | Sequence[str] | None = ${repr(down_revision)}
branch_labels: str | Sequence[str] | None = ${repr(branch_labels)}
depends_on: str | Sequence[str] | None = ${repr(depends_on)}


def upgrade() -> None:
    """Upgrade the framework's tables."""
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    """Downgrade the framework's tables."""
    ${downgrades if downgrades else "pass"}
