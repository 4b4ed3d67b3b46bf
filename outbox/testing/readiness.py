"""Wait until a started service really works, not merely until its port is open."""

from __future__ import annotations

import json
import logging
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from outbox.testing.service import ServiceStartError

# Connection-refused chatter while a broker starts is expected; keep it off stderr.
_quiet = logging.getLogger("outbox.testing.readiness.librdkafka")
_quiet.setLevel(logging.CRITICAL)


def wait_for_kafka(
    bootstrap: str, *, timeout: float = 90.0, alive: Callable[[], bool] = lambda: True
) -> None:
    """Block until a produce + consume round trip through ``bootstrap`` succeeds.

    Raises:
        ServiceStartError: the broker did not answer within ``timeout`` or its process died.
    """
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    deadline = time.monotonic() + timeout
    topic = f"__outbox_readiness_{uuid.uuid4().hex[:8]}"
    # Kept as text: an exception kept would hold its traceback, and so this frame, in a cycle
    # that only the cyclic collector frees - with the probe's producer, whose connection then
    # stays open after the broker is ready (a test counting its connections saw it).
    last_error = ""
    while time.monotonic() < deadline:
        if not alive():
            raise ServiceStartError(f"Kafka at {bootstrap} exited while starting")
        try:
            producer = Producer(
                {"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000}, logger=_quiet
            )
            producer.produce(topic, b"ping")
            if producer.flush(5) != 0:
                raise TimeoutError("produce not acknowledged within 5 s")
            consumer = Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": topic,
                    "enable.auto.commit": False,
                },
                logger=_quiet,
            )
            try:
                consumer.assign([TopicPartition(topic, 0, 0)])
                msg = consumer.poll(10)
                if msg is not None and msg.error() is None and msg.value() == b"ping":
                    return
                last_error = str(msg.error()) if msg is not None else "no record within 10 s"
            finally:
                consumer.close()
        except (KafkaException, TimeoutError) as err:
            last_error = str(err)
        time.sleep(0.5)
    raise ServiceStartError(f"Kafka at {bootstrap} not ready after {timeout:.0f} s: {last_error}")


def wait_for_postgres(
    url: str, *, timeout: float = 60.0, alive: Callable[[], bool] = lambda: True
) -> None:
    """Block until ``SELECT 1`` succeeds on ``url`` (an SQLAlchemy URL).

    Raises:
        ServiceStartError: no answer within ``timeout``, or the server process died.
    """
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    deadline = time.monotonic() + timeout
    last_error = ""  # text, not the exception: see wait_for_kafka
    try:
        while time.monotonic() < deadline:
            if not alive():
                raise ServiceStartError(f"PostgreSQL at {url} exited while starting")
            try:
                with engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
                return
            except sa.exc.OperationalError as err:
                last_error = str(err)
                time.sleep(0.3)
    finally:
        engine.dispose()
    raise ServiceStartError(f"PostgreSQL at {url} not ready after {timeout:.0f} s: {last_error}")


def wait_for_schema_registry(
    url: str,
    *,
    health_url: str | None = None,
    timeout: float = 60.0,
    alive: Callable[[], bool] = lambda: True,
) -> None:
    """Block until the registry's health endpoint (when given) says UP and its
    Confluent-compatible API at ``url`` lists its subjects.

    Raises:
        ServiceStartError: no answer within ``timeout``, or the registry's process died.
    """
    checks: list[tuple[str, Callable[[Any], bool]]] = []
    if health_url:
        checks.append((health_url, lambda body: body.get("status") == "UP"))
    checks.append((f"{url.rstrip('/')}/subjects", lambda body: isinstance(body, list)))
    deadline = time.monotonic() + timeout
    last_error: str | None = None
    while time.monotonic() < deadline:
        if not alive():
            raise ServiceStartError(f"the schema registry at {url} exited while starting")
        last_error = next(filter(None, (_http_check(*check) for check in checks)), None)
        if last_error is None:
            return
        time.sleep(0.3)
    raise ServiceStartError(
        f"the schema registry at {url} not ready after {timeout:.0f} s: {last_error}"
    )


def _http_check(url: str, ready: Callable[[Any], bool]) -> str | None:
    """None when ``GET url`` answers JSON that ``ready`` accepts, else what went wrong."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.loads(response.read())
        if ready(body):
            return None
        return f"GET {url}: {body!r:.200}"
    except (OSError, ValueError, AttributeError) as err:  # URLError, HTTPError are OSErrors
        return f"GET {url}: {err!r}"
