"""The outbox transaction as a FastAPI dependency with ``yield``: the way a FastAPI service
usually opens a per-request transaction (``examples/fastapi_orders`` uses the decorator).

A dependency with ``yield`` ends when FastAPI closes its exit stack: by default (``scope``
"request") after the response has been sent, with ``Depends(..., scope="function")`` (FastAPI
0.121 and later) when the endpoint returns, before the response. The outbox's COMMIT is that
exit. So with the default the client already has its 201 when the COMMIT runs, and a transaction
refused or failing there (an ``outbox.send()`` never awaited, a fenced id, the database gone)
answered 201 for an order that was rolled back; with ``scope="function"`` the same request
answers 500. The messages follow the database either way: nothing is delivered for a rolled-back
order. The README's FastAPI section says to use ``scope="function"``; this test is why.

Each case ends in a ``read_committed`` read of the real topic and a look at the rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any, Literal

import httpx
import pytest
import sqlalchemy as sa
from fastapi import BackgroundTasks, Depends, FastAPI, HTTPException
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import AsyncOutboxTransaction, OutboxProducer, OutboxTransaction
from outbox.errors import NoActiveTransactionError
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import unique
from tests.outbox.test_asyncio import async_factory
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration

Scope = Literal["function", "request"]


def orders_app(
    producer: OutboxProducer,
    factory: async_sessionmaker[AsyncSession],
    topic: str,
    scope: Scope,
    events: list[str],
) -> Any:
    """An orders service whose transaction is a dependency with ``yield`` of the given scope,
    wrapped so that ``events`` records when the response starts and when the COMMIT returned."""

    async def get_session() -> AsyncIterator[AsyncSession]:
        async with factory() as session:
            yield session

    # defaults, not Annotated: the annotations are text here, and FastAPI resolves them in the
    # module, where these functions are not
    in_a_session = Depends(get_session)

    async def transaction(session: AsyncSession = in_a_session) -> AsyncIterator[Any]:
        async with producer.transaction(session) as txn:
            yield txn
        events.append("committed")

    in_a_transaction = Depends(transaction, scope=scope)

    @outbox.transactional(producer=producer, session_factory=factory)
    async def place_later(order_id: str, request_txn_id: str, *, session: AsyncSession) -> None:
        joined = outbox.current_transaction().txn_id == request_txn_id
        events.append("later joined" if joined else "later own")
        await session.execute(orders.insert().values(id=order_id, amount=1))
        await outbox.send(topic, order_id, key=order_id)

    app = FastAPI()

    @app.post("/orders/{order_id}", status_code=201)
    async def place(
        order_id: str,
        tasks: BackgroundTasks,
        outcome: str = "commit",
        txn: AsyncOutboxTransaction = in_a_transaction,
    ) -> dict[str, str]:
        assert txn.session is not None
        await txn.session.execute(orders.insert().values(id=order_id, amount=1))
        if outcome == "unawaited":  # a send never awaited: refused at the COMMIT
            outbox.send(topic, order_id, key=order_id)
            return {"order_id": order_id}
        await outbox.send(topic, order_id, key=order_id)
        if outcome == "decline":
            raise HTTPException(status_code=402, detail="payment declined")
        tasks.add_task(place_later, f"{order_id}-later", txn.txn_id)
        return {"order_id": order_id}

    async def recorded(scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                events.append(f"response {message['status']}")
            await send(message)

        await app(scope, receive, sending)

    return recorded


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_transaction_dependency_commits_before_the_response_only_with_function_scope(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    committed: list[str] = []
    refused: list[str] = []
    seen: dict[tuple[Scope, str], tuple[int, list[str]]] = {}

    with pipeline(kafka_bootstrap, topics) as running:

        async def requests() -> None:
            async with async_factory(db_url) as factory:
                for scope in ("function", "request"):
                    for outcome in ("commit", "decline", "unawaited"):
                        events: list[str] = []
                        app = orders_app(producer, factory, running.topic, scope, events)
                        order = unique(f"{scope}-{outcome}")
                        # the app's exceptions as a server sees them: after its response, none
                        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
                        async with httpx.AsyncClient(
                            transport=transport, base_url="http://orders"
                        ) as client:
                            answer = await client.post(
                                f"/orders/{order}", params={"outcome": outcome}
                            )
                        seen[scope, outcome] = (answer.status_code, events)
                        if outcome == "commit":
                            committed.extend([order, f"{order}-later"])
                        else:
                            refused.append(order)

        asyncio.run(requests())

        # Given scope "function": the COMMIT returns before the response, a refusal answers 500,
        # and a background task's transaction is its own
        assert seen["function", "commit"] == (201, ["committed", "response 201", "later own"])
        assert seen["function", "decline"] == (402, ["response 402"])
        assert seen["function", "unawaited"] == (500, ["response 500"])
        # Given the default scope: the response goes first, so a refused COMMIT answered 201, and
        # a background task runs inside the request's transaction (a failure there rolls back
        # the order that answered 201)
        assert seen["request", "commit"] == (201, ["response 201", "later joined", "committed"])
        assert seen["request", "decline"] == (402, ["response 402"])
        assert seen["request", "unawaited"] == (201, ["response 201"])

        # Then either way the topic follows the database: each committed order once, no other
        running.agree(order_ids(engine), committed, refused)


def sync_orders_app(producer: OutboxProducer, factory: sessionmaker, topic: str) -> Any:
    """The same service written with plain ``def``: FastAPI runs the dependency's setup, the
    endpoint and its exit in worker threads, each in a copy of the request's context."""

    def get_session() -> Iterator[Session]:
        with factory() as session:
            yield session

    in_a_session = Depends(get_session)

    def transaction(session: Session = in_a_session) -> Iterator[Any]:
        with producer.transaction(session) as txn:
            yield txn

    in_a_transaction = Depends(transaction, scope="function")
    app = FastAPI()

    @app.post("/orders/{order_id}", status_code=201)
    def place(
        order_id: str, outcome: str = "commit", txn: OutboxTransaction = in_a_transaction
    ) -> dict[str, str]:
        assert txn.session is not None
        txn.session.execute(orders.insert().values(id=order_id, amount=1))
        if outcome == "current":  # the endpoint's context never had the dependency's
            outbox.send(topic, order_id, key=order_id)
        txn.send(topic, order_id, key=order_id)
        if outcome == "decline":
            raise HTTPException(status_code=402, detail="payment declined")
        return {"order_id": order_id}

    return app


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_plain_def_transaction_dependency_sends_with_the_transaction_it_yields(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    session_factory: sessionmaker,
    topics: Topics,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    committed, refused = [unique("def-commit")], [unique("def-decline"), unique("def-current")]

    with pipeline(kafka_bootstrap, topics) as running:
        app = sync_orders_app(producer, session_factory, running.topic)

        async def post(order: str, outcome: str) -> int:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://orders") as client:
                answer = await client.post(f"/orders/{order}", params={"outcome": outcome})
            return answer.status_code

        # Given txn.send(): a committed order and a declined one, across three threads
        assert asyncio.run(post(committed[0], "commit")) == 201
        assert asyncio.run(post(refused[0], "decline")) == 402
        # Given outbox.send(): refused, naming where the transaction is current and the fix
        with pytest.raises(NoActiveTransactionError, match=r"another thread.*txn\.send"):
            asyncio.run(post(refused[1], "current"))

        # Then the topic follows the database: the committed order once, the others neither
        running.agree(order_ids(engine), committed, refused)
