"""Where the checker reaches a producer's check endpoint: an explicit setting, and a warning when
the endpoint could not be reached from another host (the default listens on loopback and
advertises that; a checker elsewhere finds the instance live, cannot reach it, and gives its
transactions up)."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import urllib.request

import pytest
import sqlalchemy as sa

from checker.instances import LiveInstances
from outbox import OutboxProducer, OutboxSettings
from outbox.checks import CHECK_PATH
from outbox.checks.auth import sign
from outbox.protocol import new_transaction_id
from outbox.testing.ports import free_port

pytestmark = pytest.mark.integration


def test_serving_on_loopback_without_an_advertised_address_warns(
    producer: OutboxProducer, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="outbox"):
        server = producer.serve_checks(engine=engine, secret="s")
    assert f"advertises {server.url}: only a checker on this host can reach it" in caplog.text
    assert "OUTBOX_CHECK_ADVERTISE_URL" in caplog.text  # and names the fix
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="outbox"):
        producer.serve_checks(
            "0.0.0.0", engine=engine, secret="s", advertise_url="http://10.0.0.7:8081"
        )
    assert "only a checker on this host" not in caplog.text
    assert "cannot reach" not in caplog.text


def test_serving_on_loopback_while_advertising_another_host_warns(
    producer: OutboxProducer, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="outbox"):
        producer.serve_checks(
            "127.0.0.1", engine=engine, secret="s", advertise_url="http://10.0.0.7:8081"
        )
    assert "listens on 127.0.0.1 (this host only) but advertises http://10.0.0.7:8081" in (
        caplog.text
    )
    assert "OUTBOX_CHECK_HOST" in caplog.text


def test_serving_on_every_interface_without_an_advertised_address_warns(
    producer: OutboxProducer, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # half of the fix the loopback warning asks for: 0.0.0.0 announced is no address at all
    with caplog.at_level(logging.WARNING, logger="outbox"):
        server = producer.serve_checks("0.0.0.0", engine=engine, secret="s")
    assert f"advertises {server.url}, which is no address a checker can reach" in caplog.text
    assert "OUTBOX_CHECK_ADVERTISE_URL" in caplog.text


def test_the_endpoint_is_served_and_announced_as_its_settings_say(
    outbox_settings: OutboxSettings, engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # Given the endpoint configured by settings alone (OUTBOX_CHECK_HOST, _PORT, _ADVERTISE_URL,
    # _SECRET), as a Deployment advertising its pod IP would
    port = free_port()
    advertised = f"http://127.0.0.2:{port}"  # another address of this host, as a pod IP
    settings = dataclasses.replace(
        outbox_settings,
        check_host="0.0.0.0",
        check_port=port,
        check_advertise_url=advertised,
        check_secret="from-settings",
    )
    with OutboxProducer(settings) as producer, caplog.at_level(logging.WARNING, logger="outbox"):
        server = producer.serve_checks(engine=engine)
        # Then it listens on that port on every interface, answers requests signed with the
        # settings' secret at the advertised address, and the registry announces that address
        assert server.url.endswith(f":{port}")
        body = json.dumps({"txn_ids": [new_transaction_id()]}).encode()
        request = urllib.request.Request(
            advertised + CHECK_PATH,
            data=body,
            headers=sign(b"from-settings", "POST", CHECK_PATH, body),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        registry = LiveInstances(
            {"bootstrap.servers": settings.bootstrap_servers}, settings.topics.registry, 30
        )
        try:
            deadline = time.monotonic() + 30
            while not registry.live(settings.producer_group):
                assert time.monotonic() < deadline, "never announced"
                registry.poll()
                time.sleep(0.2)
            assert {r.check_url for r in registry.live(settings.producer_group)} == {advertised}
        finally:
            registry.close()
    # listening on every interface: no warning about a loopback-only endpoint (the advertised
    # 127.0.0.2 stands for a pod IP here, and is warned about as the loopback address it is)
    assert "unless a proxy" not in caplog.text
