"""Harness settings come from OUTBOX_TEST_* variables and reject what they cannot use."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox.testing import HarnessSettings, ServiceStartError


def test_defaults_choose_automatically_and_start_everything() -> None:
    settings = HarnessSettings.from_env({})
    assert settings.provider == "auto"
    assert settings.kafka_bootstrap is None
    assert settings.postgres_url is None
    assert settings.ci is False


def test_environment_forces_a_provider_and_supplies_running_services() -> None:
    settings = HarnessSettings.from_env(
        {
            "OUTBOX_TEST_PROVIDER": "Local",
            "OUTBOX_TEST_KAFKA_BOOTSTRAP": "broker:9092",
            "OUTBOX_TEST_POSTGRES_URL": "postgresql+psycopg://u@db/x",
            "OUTBOX_TEST_BUILD_IMAGES": "no",
            "OUTBOX_CACHE_DIR": "/somewhere",
            "CI": "true",
        }
    )
    assert settings.provider == "local"
    assert settings.kafka_bootstrap == "broker:9092"
    assert settings.postgres_url == "postgresql+psycopg://u@db/x"
    assert settings.build_images is False
    assert settings.cache_dir == Path("/somewhere")
    assert settings.ci is True


def test_unknown_provider_is_rejected_with_the_choices() -> None:
    with pytest.raises(ServiceStartError, match=r"'kubernetes' is not a provider.*containers"):
        HarnessSettings.from_env({"OUTBOX_TEST_PROVIDER": "kubernetes"})


def test_missing_jars_name_the_folder_and_the_fix(tmp_path: Path) -> None:
    settings = HarnessSettings(cache_dir=tmp_path)
    with pytest.raises(ServiceStartError, match=r"no Kafka broker jars in .*make jars"):
        settings.kafka_classpath()


def test_a_running_schema_registry_comes_from_the_environment() -> None:
    url = "http://registry:8080/apis/ccompat/v7"
    settings = HarnessSettings.from_env({"OUTBOX_TEST_SCHEMA_REGISTRY_URL": url})
    assert settings.schema_registry_url == url
    assert HarnessSettings.from_env({}).schema_registry_url is None


def test_a_missing_schema_registry_build_names_the_folder_and_the_fix(tmp_path: Path) -> None:
    settings = HarnessSettings(cache_dir=tmp_path)
    with pytest.raises(ServiceStartError, match=r"no schema registry in .*make jars"):
        settings.schema_registry_jar()


def test_the_event_loop_comes_from_the_environment_and_unknown_ones_are_rejected() -> None:
    assert HarnessSettings.from_env({}).event_loop == "asyncio"
    assert HarnessSettings.from_env({"OUTBOX_TEST_EVENT_LOOP": " UVLoop "}).event_loop == "uvloop"
    with pytest.raises(ServiceStartError, match=r"'trio' is not an event loop.*uvloop"):
        HarnessSettings.from_env({"OUTBOX_TEST_EVENT_LOOP": "trio"})
