"""The schema registry the harness starts is a real one: it registers a schema under a subject
and serves it back through the Confluent-compatible API, and it is gone once stopped."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import urllib.request

import pytest

from outbox.testing import HarnessSettings, ServiceStartError, start_schema_registry
from outbox.testing.ports import free_port
from outbox.testing.readiness import wait_for_schema_registry
from tests.kafka_helpers import unique

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def _call(url: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": CONTENT_TYPE})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.integration
def test_the_registry_registers_a_schema_under_its_subject_and_serves_it_back(
    schema_registry_url: str,
) -> None:
    subject = unique("smoke") + "-value"
    schema = json.dumps({"type": "record", "name": "Ping", "fields": []})
    registered = _call(f"{schema_registry_url}/subjects/{subject}/versions", {"schema": schema})
    assert isinstance(registered, dict)
    served = _call(f"{schema_registry_url}/schemas/ids/{registered['id']}")
    assert isinstance(served, dict) and json.loads(served["schema"])["name"] == "Ping"
    assert subject in _call(f"{schema_registry_url}/subjects")  # type: ignore[operator]


@pytest.mark.integration
def test_a_registry_started_on_its_own_is_gone_once_stopped(
    harness_settings: HarnessSettings,
) -> None:
    try:
        service = start_schema_registry(harness_settings, provider="local")
    except ServiceStartError as err:  # as the fixtures treat it
        if harness_settings.ci:
            pytest.fail(f"could not start a test service: {err}", pytrace=False)
        pytest.skip(f"could not start a test service: {err}")
    with service:
        assert service.provider == "local"
        assert service.address.endswith("/apis/ccompat/v7")
        port = urllib.parse.urlsplit(service.address).port
        assert _call(f"{service.address}/subjects") == []  # its own storage, in memory
    assert port is not None
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_waiting_for_a_registry_that_never_answers_fails_with_the_address() -> None:
    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    started = time.monotonic()
    with pytest.raises(ServiceStartError, match=r"not ready after 1 s: GET .*/subjects"):
        wait_for_schema_registry(url, timeout=1)
    assert time.monotonic() - started < 10


def test_waiting_for_a_registry_whose_process_died_fails_at_once() -> None:
    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    with pytest.raises(ServiceStartError, match="exited while starting"):
        wait_for_schema_registry(url, timeout=30, alive=lambda: False)
