"""The readiness probes let go of their clients once the service is ready."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import confluent_kafka
import pytest

from outbox.testing.readiness import wait_for_kafka

pytestmark = pytest.mark.integration


class _SlowFirstProducer(confluent_kafka.Producer):
    """The probe's producer, whose first flush does not see its record acknowledged in time
    (a broker still starting, on a slow host)."""

    flushed = 0

    def flush(self, *args: float) -> int:
        _SlowFirstProducer.flushed += 1
        acknowledged = super().flush(*args)
        return 1 if _SlowFirstProducer.flushed == 1 else acknowledged


@pytest.fixture
def no_cyclic_collector() -> Iterator[None]:
    """Only reference counts free objects: what a cycle holds stays visible."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_probe_that_retried_leaves_no_client_alive(
    kafka_bootstrap: str, no_cyclic_collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed attempt's exception kept by the probe held its frame - and the last attempt's
    producer, connected to the broker - in a cycle, until the cyclic collector ran: a test that
    counted its connections to a broker it had just started found one open."""
    _SlowFirstProducer.flushed = 0
    monkeypatch.setattr(confluent_kafka, "Producer", _SlowFirstProducer)

    wait_for_kafka(kafka_bootstrap, timeout=60)

    assert _SlowFirstProducer.flushed >= 2  # it retried
    alive = [o for o in gc.get_objects() if isinstance(o, _SlowFirstProducer)]
    assert alive == [], f"{len(alive)} probe producer(s) still alive after the probe returned"
