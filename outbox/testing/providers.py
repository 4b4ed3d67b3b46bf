"""Choosing how a service runs: an existing one, a container, or a local process.

``auto`` prefers containers whenever a container engine (Docker or Podman) is reachable, and
falls back to local processes; ``OUTBOX_TEST_PROVIDER`` forces one, and an address in
``OUTBOX_TEST_KAFKA_BOOTSTRAP`` / ``OUTBOX_TEST_POSTGRES_URL`` /
``OUTBOX_TEST_SCHEMA_REGISTRY_URL`` uses a service already running. The schema registry is
always a local process (:mod:`outbox.testing.registry_process` says why).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import TYPE_CHECKING, Literal

from outbox.testing.readiness import wait_for_kafka, wait_for_postgres, wait_for_schema_registry
from outbox.testing.service import RunningService, ServiceStartError
from outbox.testing.settings import ENV_PROVIDER, HarnessSettings

if TYPE_CHECKING:
    from outbox.testing.engine import Engine

Provider = Literal["auto", "containers", "local"]


def start_kafka(
    settings: HarnessSettings | None = None, *, provider: Provider | None = None
) -> RunningService:
    """Start (or find) a single-node KRaft broker that is ready for a produce/consume round trip.

    Raises:
        ServiceStartError: with the reason and the fix (missing jars, no engine, broker log tail).
    """
    settings = _settings(settings, provider)
    if settings.kafka_bootstrap and provider is None:
        wait_for_kafka(settings.kafka_bootstrap, timeout=30)
        return RunningService(name="kafka", provider="external", address=settings.kafka_bootstrap)
    engine = choose_engine(settings)
    if engine is not None:
        from outbox.testing.containers import start_kafka_container

        return start_kafka_container(settings, engine)
    from outbox.testing.kafka_process import start_kafka_process

    return start_kafka_process(settings)


def start_postgres(
    settings: HarnessSettings | None = None, *, provider: Provider | None = None
) -> RunningService:
    """Start (or find) a PostgreSQL server; ``address`` is an SQLAlchemy URL (psycopg 3).

    Raises:
        ServiceStartError: with the reason and the fix.
    """
    settings = _settings(settings, provider)
    if settings.postgres_url and provider is None:
        wait_for_postgres(settings.postgres_url, timeout=30)
        return RunningService(name="postgresql", provider="external", address=settings.postgres_url)
    engine = choose_engine(settings)
    if engine is not None:
        from outbox.testing.containers import start_postgres_container

        return start_postgres_container(settings, engine)
    from outbox.testing.postgres_process import start_postgres_process

    return start_postgres_process(settings)


def start_schema_registry(
    settings: HarnessSettings | None = None, *, provider: Provider | None = None
) -> RunningService:
    """Start (or find) a schema registry; ``address`` is its Confluent-compatible API's URL
    (``SchemaRegistryClient({"url": address})``).

    ``provider`` is accepted as the other starters accept it; the registry runs as a local
    process under any of them.

    Raises:
        ServiceStartError: with the reason and the fix (no jar: ``make jars``; its log's tail).
    """
    settings = _settings(settings, provider)
    if settings.schema_registry_url and provider is None:
        wait_for_schema_registry(settings.schema_registry_url, timeout=30)
        return RunningService(
            name="schema-registry", provider="external", address=settings.schema_registry_url
        )
    from outbox.testing.registry_process import start_registry_process

    return start_registry_process(settings)


def choose_engine(settings: HarnessSettings) -> Engine | None:
    """The container engine to use, or None for local processes."""
    if settings.provider == "local":
        return None
    engine = _find_engine(settings)
    if engine is None and settings.provider == "containers":
        raise ServiceStartError(
            f"{ENV_PROVIDER}=containers, but no container engine answers: start Docker, or "
            "install Podman (`apt-get install podman runc`; `make setup` does it as root)"
        )
    return engine


@cache
def _find_engine(settings: HarnessSettings) -> Engine | None:
    from outbox.testing.engine import find_engine

    return find_engine(settings)


def _settings(settings: HarnessSettings | None, provider: Provider | None) -> HarnessSettings:
    settings = settings or HarnessSettings.from_env()
    return replace(settings, provider=provider) if provider else settings
