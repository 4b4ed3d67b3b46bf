"""How an application calls the public API, checked by ``mypy --strict`` (test_typing.py):
typing mistakes in the decorator's signatures show up here as errors in user code."""

from __future__ import annotations

import contextlib

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import SerializationContext, StringSerializer
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import (
    AsyncOutboxTransaction,
    HalfCoordinates,
    OutboxProducer,
    OutboxSettings,
    OutboxTransaction,
)


def setup(producer: OutboxProducer, factory: sessionmaker[Session]) -> None:
    @outbox.transactional(producer=producer, session_factory=factory)
    def place_order(order_id: str, session: Session = outbox.INJECTED) -> str:
        outbox.send("orders", order_id, key=order_id)
        return order_id

    placed: str = place_order("o1")
    print(placed)
    with producer.transaction(factory) as txn:
        sync_txn: OutboxTransaction = txn
        where: HalfCoordinates = txn.send("orders", b"x")
        print(sync_txn, where)
    with contextlib.ExitStack() as stack:  # looks the exit up on the type
        stacked: OutboxTransaction = stack.enter_context(producer.transaction(factory))
        print(stacked)


async def setup_async(producer: OutboxProducer, factory: async_sessionmaker[AsyncSession]) -> None:
    @outbox.transactional(producer=producer, session_factory=factory)
    async def place_order(order_id: str, session: AsyncSession = outbox.INJECTED) -> str:
        session.add_all([])
        coordinates: HalfCoordinates = await outbox.send("orders", order_id, key=order_id)
        await outbox.send_batch([outbox.Message("orders", order_id)])
        print(coordinates)
        return order_id

    placed: str = await place_order("o1")
    print(placed)
    async with producer.transaction(factory) as txn:
        async_txn: AsyncOutboxTransaction = txn
        where: HalfCoordinates = await txn.send("orders", b"x")
        print(async_txn, where)
    async with contextlib.AsyncExitStack() as stack:
        stacked = await stack.enter_async_context(producer.transaction(factory))
        stacked_txn: AsyncOutboxTransaction = stacked
        print(stacked_txn)


def serializers(settings: OutboxSettings, registry: SchemaRegistryClient) -> None:
    """One-argument callables and confluent-kafka's ``serializer(obj, ctx)`` alike."""

    def with_context(order: dict[str, int], ctx: SerializationContext) -> bytes:
        return f"{ctx.topic}:{order}".encode()

    avro = AvroSerializer(registry, '"string"')
    producer = OutboxProducer(settings, serializer=avro, key_serializer=StringSerializer())
    with producer.transaction(lambda: Session()) as txn:
        txn.send("orders", "o1", serializer=outbox.json_serializer)
        txn.send("orders", {"id": 1}, key="o1", serializer=with_context, key_serializer=avro)
        outbox.send("orders", {"id": 1}, serializer=lambda order: repr(order).encode())
        outbox.send_batch([outbox.Message("orders", "o1")], key_serializer=StringSerializer())
