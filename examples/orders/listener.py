"""The orders service's RocketMQ-style path: ``TransactionalProducer`` with a listener.

A team porting code from RocketMQ keeps its listener: ``execute_local_transaction`` places the
order in its own database transaction, and ``check_local_transaction`` looks the order up when
the outcome never arrived. The outbox sends the ``OrderPlaced`` half message first and asks the
listener's check, with that message, whenever no op decided the transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from service import ORDERS_TOPIC, Order
from sqlalchemy.orm import Session

from outbox import LocalTransactionState, Message, MessageView


@dataclass(frozen=True)
class OrderRequest:
    """The ``arg`` of ``send_message_in_transaction``: what the local transaction needs."""

    order_id: str
    customer: str
    amount_cents: int
    decline: bool = False
    #: Answer UNKNOWN after committing (as RocketMQ's guidance warns code sometimes does, e.g.
    #: when it cannot tell whether its commit went through); the check settles it.
    answer_unknown: bool = False


def order_placed(request: OrderRequest) -> Message:
    event = {
        "type": "OrderPlaced",
        "order_id": request.order_id,
        "amount_cents": request.amount_cents,
    }
    return Message(
        ORDERS_TOPIC,
        json.dumps(event),
        key=request.customer,
        properties={"order-id": request.order_id},
    )


class OrdersListener:
    """``TransactionListener`` of the orders service."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        request: OrderRequest = arg
        if request.decline:
            return LocalTransactionState.ROLLBACK  # payment declined: nothing written
        with Session(self.engine) as session, session.begin():
            session.add(
                Order(
                    id=request.order_id,
                    customer=request.customer,
                    amount_cents=request.amount_cents,
                )
            )
        if request.answer_unknown:
            return LocalTransactionState.UNKNOWN
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: MessageView) -> LocalTransactionState:
        order_id = msg.properties["order-id"]
        with Session(self.engine) as session:
            placed = session.get(Order, order_id) is not None
        return LocalTransactionState.COMMIT if placed else LocalTransactionState.ROLLBACK
