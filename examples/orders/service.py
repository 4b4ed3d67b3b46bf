"""An example "orders" service, written the way an application team would write it.

Placing an order inserts a row and emits an ``OrderPlaced`` event; both happen or neither.
"""

from __future__ import annotations

import json
import time

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import outbox

ORDERS_TOPIC = "orders"


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    customer: Mapped[str] = mapped_column(sa.String(64))
    amount_cents: Mapped[int]


class PaymentDeclined(Exception):
    """The business rule that makes some orders fail (and roll back) on purpose."""


@outbox.transactional
def place_order(
    order_id: str,
    customer: str,
    amount_cents: int,
    *,
    decline: bool,
    payment_seconds: float = 0.0,
    session: Session,
) -> None:
    session.add(Order(id=order_id, customer=customer, amount_cents=amount_cents))
    event = {"type": "OrderPlaced", "order_id": order_id, "amount_cents": amount_cents}
    outbox.send(ORDERS_TOPIC, json.dumps(event), key=customer)
    time.sleep(payment_seconds)  # a slow payment provider keeps the transaction open
    if decline:
        raise PaymentDeclined(f"payment for {order_id} declined")
