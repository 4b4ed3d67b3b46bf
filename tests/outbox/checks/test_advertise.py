"""A check endpoint served the default way listens on loopback and advertises that address,
which a checker on another host cannot reach: the producer says so when it starts serving."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from outbox import OutboxProducer

pytestmark = pytest.mark.integration


def test_serving_on_loopback_without_an_advertised_address_warns(
    producer: OutboxProducer, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="outbox"):
        server = producer.serve_checks(engine=engine, secret="s")
    assert f"advertises {server.url}: only a checker on this host can reach it" in caplog.text
    assert "advertise_url=" in caplog.text  # and names the fix
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="outbox"):
        producer.serve_checks(
            "0.0.0.0", engine=engine, secret="s", advertise_url="http://10.0.0.7:8081"
        )
    assert "only a checker on this host" not in caplog.text
