"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.migrations.history import ensure_one_history
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    # First, in every outbox revision: refuse to run where the other version table has ours.
    ensure_one_history(op.get_context())
    ${upgrades if upgrades else ""}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
