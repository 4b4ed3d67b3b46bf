"""The orders service as a FastAPI application on SQLAlchemy's AsyncSession.

Placing an order (``POST /orders``) inserts a row and emits an ``OrderPlaced`` event; both happen
or neither. The application's lifespan creates the outbox producer and mounts the check endpoint
the checker asks when an outcome is lost; every worker process does so for itself (its own
producer, its own instance id in the registry, all behind one URL).

Configuration is the environment: the producer's ``OUTBOX_*`` settings
(``OUTBOX_BOOTSTRAP_SERVERS``, ``OUTBOX_PRODUCER_GROUP``, ...) with the check endpoint's
``OUTBOX_CHECK_SECRET`` (shared with the checker; or ``OUTBOX_CHECK_SECRET_FILE``) and
``OUTBOX_CHECK_ADVERTISE_URL`` (where the checker reaches this service), and this service's own
``ORDERS_DATABASE_URL`` (an asyncio driver: ``postgresql+psycopg://...`` or
``sqlite+aiosqlite:///...``). Run, after ``kafka-outbox topics ensure``,
``kafka-outbox migrate`` and ``python examples/fastapi_orders/schema.py`` (this service's own
table)::

    uvicorn app:app --app-dir examples/fastapi_orders --host 0.0.0.0 --port 8000 --workers 2
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from schema import Order
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

import outbox

ORDERS_TOPIC = os.environ.get("ORDERS_TOPIC", "orders")

engine = create_async_engine(os.environ["ORDERS_DATABASE_URL"])
Session = async_sessionmaker(engine, expire_on_commit=False)


class PaymentDeclined(Exception):
    """The business rule that makes some orders fail (and roll back) on purpose."""


class PlaceOrder(BaseModel):
    order_id: str
    customer: str
    amount_cents: int
    decline: bool = False


@outbox.transactional
async def place_order(order: PlaceOrder, session: AsyncSession = outbox.INJECTED) -> None:
    session.add(Order(id=order.order_id, customer=order.customer, amount_cents=order.amount_cents))
    event = {"type": "OrderPlaced", "order_id": order.order_id, "amount_cents": order.amount_cents}
    await outbox.send(ORDERS_TOPIC, json.dumps(event), key=order.customer)
    if order.decline:
        raise PaymentDeclined(f"payment for {order.order_id} declined")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    producer = outbox.OutboxProducer(outbox.OutboxSettings.from_env())
    outbox.configure(producer=producer, session_factory=Session)
    # secret and advertised URL from OUTBOX_CHECK_SECRET and OUTBOX_CHECK_ADVERTISE_URL
    checks = producer.check_app(engine=engine)
    app.mount("/", checks)  # last: it answers /outbox/check only
    async with checks.running():  # the registry heartbeat, while this worker serves
        yield
    await asyncio.to_thread(producer.close)  # flushes the ops still queued
    await engine.dispose()


app = FastAPI(title="orders", lifespan=lifespan)


@app.post("/orders", status_code=201)
async def create_order(order: PlaceOrder) -> dict[str, str]:
    try:
        await place_order(order)
    except PaymentDeclined as err:
        raise HTTPException(status_code=402, detail=str(err)) from err
    return {"order_id": order.order_id}
