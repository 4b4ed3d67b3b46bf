"""Real services for tests, the demo and the benchmarks.

Starts a single-node KRaft Kafka broker and a throwaway PostgreSQL cluster, either as containers
(testcontainers, on Docker or Podman) or as local processes, and a schema registry (Apicurio, its
Confluent-compatible API) as a local process, and hands back their addresses. The producer
library never imports this package; it needs the ``testing`` extra.

Typical use outside pytest::

    from outbox.testing import start_kafka, start_postgres
    with start_kafka() as kafka, start_postgres() as pg:
        print(kafka.address, pg.address)
"""

from __future__ import annotations

from outbox.testing.providers import Provider, start_kafka, start_postgres, start_schema_registry
from outbox.testing.service import RunningService, ServiceStartError
from outbox.testing.settings import HarnessSettings

__all__ = [
    "HarnessSettings",
    "Provider",
    "RunningService",
    "ServiceStartError",
    "start_kafka",
    "start_postgres",
    "start_schema_registry",
]
