"""deploy/compose.yaml: the services a laptop needs, from the official images and ours, with real
commands and real settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from outbox_cli.main import build_parser
from outbox_cli.settings import is_setting
from outbox_cli.settings import known_variables as _known

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
OUR_IMAGE = "kafka-outbox:dev"


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(COMPOSE.read_text())  # PyYAML resolves the << merge keys
    return dict(document["services"])


def test_compose_starts_kafka_postgres_relay_checker_and_the_example_producer(
    services: dict[str, dict[str, Any]],
) -> None:
    assert {"kafka", "postgres", "relay", "checker", "producer"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["postgres"]["image"].startswith("postgres:")
    for name in ("topics", "migrate", "relay", "checker", "producer"):
        service = services[name]
        assert service["image"] == OUR_IMAGE
        assert service["build"] == {"context": "..", "dockerfile": "deploy/Containerfile"}
        assert (COMPOSE.parent / service["build"]["context"] / "deploy/Containerfile").exists()


def test_every_command_of_our_image_is_a_real_kafka_outbox_command(
    services: dict[str, dict[str, Any]],
) -> None:
    parser = build_parser()
    for name, service in services.items():
        if service.get("image") != OUR_IMAGE or "entrypoint" in service:
            continue
        try:
            parser.parse_args(service["command"])
        except SystemExit:
            pytest.fail(f"{name}: `kafka-outbox {' '.join(service['command'])}` is not a command")
    producer = services["producer"]
    assert producer["entrypoint"][1] == "/app/examples/orders/producer.py"
    assert (DEPLOY.parent / "examples/orders/producer.py").exists()
    assert "../examples:/app/examples:ro" in producer["volumes"]


def test_every_outbox_variable_in_compose_is_a_real_setting(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        environment = service.get("environment", {})
        assert isinstance(environment, dict), f"{name}: use the mapping form"
        bad = [v for v in environment if v.startswith("OUTBOX_") and not is_setting(v)]
        assert not bad, f"{name} sets {bad}, which no settings object reads"
    relay, checker = services["relay"]["environment"], services["checker"]["environment"]
    assert relay["OUTBOX_RELAY_HTTP_PORT"] == checker["OUTBOX_CHECKER_HTTP_PORT"] == "8080"
    assert "OUTBOX_CHECK_SECRET" in checker


def test_the_check_secret_of_the_checker_and_the_producer_is_the_same(
    services: dict[str, dict[str, Any]],
) -> None:
    checker = services["checker"]["environment"]["OUTBOX_CHECK_SECRET"]
    producer = services["producer"]["environment"]["OUTBOX_CHECK_SECRET"]
    assert checker == producer  # one variable, read by both


def test_services_start_in_order_and_the_long_running_ones_are_health_checked(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in ("relay", "checker"):
        assert services[name]["depends_on"]["topics"]["condition"] == (
            "service_completed_successfully"
        )
        port = services[name]["environment"][f"OUTBOX_{name.upper()}_HTTP_PORT"]
        assert any(p.endswith(f":{port}") for p in services[name]["ports"])
    assert services["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in services["kafka"] and "healthcheck" in services["postgres"]


def test_the_setting_names_are_one_list_for_cli_compose_and_kubernetes() -> None:
    names, prefixes = _known()
    assert {"OUTBOX_BOOTSTRAP_SERVERS", "OUTBOX_RELAY_HTTP_PORT", "OUTBOX_CONFIG_FILE"} <= names
    assert "OUTBOX_RELAY_KAFKA__" in prefixes
    assert is_setting("OUTBOX_RELAY_KAFKA__SASL_PASSWORD")
    assert not is_setting("OUTBOX_RELAY_KAFKA__")
    assert not is_setting("OUTBOX_RELAY_BATCH_SIZE")
