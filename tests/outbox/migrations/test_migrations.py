"""The shipped Alembic migrations upgrade and downgrade on PostgreSQL and SQLite."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from outbox import migrations

pytestmark = pytest.mark.integration


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_sqlalchemy_round_trip(db_url: str) -> None:
    engine = sa.create_engine(db_url)
    table = sa.Table(
        "smoke_round_trip",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("note", sa.String(50)),
    )
    try:
        table.drop(engine, checkfirst=True)
        table.create(engine)
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"id": i, "note": f"n{i}"} for i in range(10)])
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"id": 99, "note": "rolled back"}])
            conn.rollback()
        with engine.connect() as conn:
            rows = conn.execute(sa.select(table.c.note).order_by(table.c.id)).scalars().all()
        assert rows == [f"n{i}" for i in range(10)]
    finally:
        table.drop(engine, checkfirst=True)
        engine.dispose()


def test_upgrade_creates_and_downgrade_removes_the_evidence_table(db_url: str) -> None:
    migrations.upgrade(db_url)
    assert {"outbox_evidence", migrations.VERSION_TABLE} <= _tables(db_url)

    engine = sa.create_engine(db_url)
    try:
        evidence = sa.Table("outbox_evidence", sa.MetaData(), autoload_with=engine)
        row = {
            "txn_id": "0190f0e4-0000-7000-8000-000000000001",
            "kind": "evidence",
            "producer_group": "orders",
            "created_at": dt.datetime.now(dt.UTC),
        }
        with engine.begin() as conn:
            conn.execute(evidence.insert(), [row])
        # The primary key is what a fence relies on: a second row for one txn id must fail.
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(evidence.insert(), [{**row, "kind": "fence"}])
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(evidence.insert(), [{**row, "txn_id": "x", "kind": "bogus"}])
    finally:
        engine.dispose()

    migrations.downgrade(db_url)
    assert "outbox_evidence" not in _tables(db_url)
