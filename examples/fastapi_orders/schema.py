"""The orders service's own table, and ``python schema.py`` to create it (at
``ORDERS_DATABASE_URL``; the outbox's tables come from ``kafka-outbox migrate``)."""

from __future__ import annotations

import asyncio
import os

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "shop_orders"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    customer: Mapped[str] = mapped_column(sa.String(64))
    amount_cents: Mapped[int]


async def create_tables(url: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(create_tables(os.environ["ORDERS_DATABASE_URL"]))
