"""Evidence pruning horizon: the time before which evidence rows may have been pruned.

``outbox.pruning.prune_evidence`` deletes evidence and fence rows older than a retention and
records the cut-off here first. A check that finds no row for a transaction that began before
the cut-off answers UNKNOWN instead of fencing it: its row may be one of those pruned, and a
fence would answer ROLLBACK for a transaction that committed.

Revision ID: outbox_0002
Revises: outbox_0001
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.migrations.history import ensure_one_history

revision = "outbox_0002"
down_revision = "outbox_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_one_history(op.get_context())
    op.create_table(
        "outbox_evidence_horizon",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("pruned_before_ms", sa.BigInteger, nullable=False),
        sa.CheckConstraint("id = 1", name="outbox_evidence_horizon_one_row"),
    )


def downgrade() -> None:
    op.drop_table("outbox_evidence_horizon")
