"""The business write every producer-side figure is made of, and pgbench's copy of it.

One transaction of the example service: one small UPDATE (a customer's order counter) and one
INSERT of a 1 KiB order row. Ours, baseline A, baseline B and the pgbench ceiling all do exactly
this, so the ceiling is the database's own limit for the same work.
"""

from __future__ import annotations

import random
from typing import Any

import sqlalchemy as sa

#: Customers, i.e. counter rows and message keys: enough that 16 workers rarely wait for the
#: same row, as in a real service.
CUSTOMERS = 100
VALUE_BYTES = 1024

_rng = random.Random(8)
#: The 1 KiB order payload (DB row) and message value (Kafka), printable so pgbench can inline it.
PAYLOAD_TEXT = "".join(_rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(1024))
PAYLOAD = PAYLOAD_TEXT.encode()
CUSTOMER_KEYS = [f"customer-{i}".encode() for i in range(CUSTOMERS + 1)]

metadata = sa.MetaData()
counters = sa.Table(
    "bench_counters",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("n", sa.BigInteger, nullable=False),
)
orders = sa.Table(
    "bench_orders",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("customer", sa.Integer, nullable=False),
    sa.Column("amount", sa.Integer, nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
)

_UPDATE = counters.update().where(counters.c.id == sa.bindparam("cid")).values(n=counters.c.n + 1)
_INSERT = orders.insert().values(customer=sa.bindparam("cid"), amount=100, payload=PAYLOAD_TEXT)


def create_schema(engine: sa.Engine) -> None:
    """The business tables, with one counter row per customer."""
    metadata.create_all(engine)
    with engine.begin() as conn:
        if not conn.execute(sa.select(sa.func.count()).select_from(counters)).scalar():
            conn.execute(counters.insert(), [{"id": i, "n": 0} for i in range(1, CUSTOMERS + 1)])


def business_write(db: Any, customer: int) -> None:
    """The UPDATE and the INSERT, on a Session or Connection inside its transaction."""
    db.execute(_UPDATE, {"cid": customer})
    db.execute(_INSERT, {"cid": customer})


def clear(engine: sa.Engine, tables: list[str]) -> None:
    """Empty the tables between configurations, so each starts from the same state."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text(f"TRUNCATE {', '.join(tables)}"))
        else:
            for table in tables:
                conn.execute(sa.text(f"DELETE FROM {table}"))


def pgbench_script() -> str:
    """pgbench's custom script: the same two statements as one transaction."""
    return (
        f"\\set cid random(1, {CUSTOMERS})\n"
        "BEGIN;\n"
        "UPDATE bench_counters SET n = n + 1 WHERE id = :cid;\n"
        "INSERT INTO bench_orders (customer, amount, payload) "
        f"VALUES (:cid, 100, '{PAYLOAD_TEXT}');\n"
        "END;\n"
    )


async def business_write_async(session: Any, customer: int) -> None:
    """:func:`business_write` on an AsyncSession."""
    await session.execute(_UPDATE, {"cid": customer})
    await session.execute(_INSERT, {"cid": customer})
