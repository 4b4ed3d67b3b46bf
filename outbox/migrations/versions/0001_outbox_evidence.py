"""Evidence table: one row per transaction id, written by the producer or by a check's fence.

The producer inserts ``kind='evidence'`` as the first statement of its local transaction, right
after the half messages are acknowledged, so the row is visible exactly when the transaction
committed. A check that finds no row inserts ``kind='fence'`` under the same primary key: a
transaction still running that later tries to insert its evidence then fails on the key, so a
ROLLBACK answer can never be contradicted by a later commit.

Revision ID: outbox_0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.migrations.history import ensure_one_history

revision = "outbox_0001"
down_revision = None
branch_labels = ("outbox",)
depends_on = None


def upgrade() -> None:
    ensure_one_history(op.get_context())
    op.create_table(
        "outbox_evidence",
        sa.Column("txn_id", sa.String(36), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("producer_group", sa.String(249), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('evidence', 'fence')", name="outbox_evidence_kind"),
    )
    op.create_index("outbox_evidence_created_at", "outbox_evidence", ["created_at"])


def downgrade() -> None:
    op.drop_index("outbox_evidence_created_at", table_name="outbox_evidence")
    op.drop_table("outbox_evidence")
