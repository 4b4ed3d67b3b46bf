"""Every service's settings come from its env prefix the same way, with errors naming the key."""

from __future__ import annotations

import pytest

from checker import CheckerSettings
from outbox import ConfigurationError, OutboxSettings
from relay import RelaySettings


def test_producer_settings_from_env_convert_types_and_pass_kafka_keys_through() -> None:
    settings = OutboxSettings.from_env(
        {
            "OUTBOX_BOOTSTRAP_SERVERS": "k:9092",
            "OUTBOX_PRODUCER_GROUP": "orders",
            "OUTBOX_PARTITIONS": "12",
            "OUTBOX_SEND_TIMEOUT_S": "2.5",
            "OUTBOX_KAFKA__LINGER_MS": "5",
        }
    )
    assert (settings.partitions, settings.send_timeout_s) == (12, 2.5)
    assert settings.kafka == {"linger.ms": "5"}


def test_services_share_the_bootstrap_variable_and_their_own_prefix_wins() -> None:
    env = {"OUTBOX_BOOTSTRAP_SERVERS": "shared:9092", "OUTBOX_RELAY_BOOTSTRAP_SERVERS": "own:9092"}
    assert RelaySettings.from_env(env).bootstrap_servers == "own:9092"
    checker = CheckerSettings.from_env(
        {
            **env,
            "OUTBOX_CHECKER_SECRET": "s",
            "OUTBOX_CHECKER_CHECK_MAX": "4",
            "OUTBOX_CHECKER_INSECURE_LOCAL": "no",
        }
    )
    assert (checker.bootstrap_servers, checker.check_max, checker.insecure_local) == (
        "shared:9092",
        4,
        False,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OUTBOX_PRODUCER_GROUP": "g"}, "set OUTBOX_BOOTSTRAP_SERVERS"),
        (
            {
                "OUTBOX_BOOTSTRAP_SERVERS": "k",
                "OUTBOX_PRODUCER_GROUP": "g",
                "OUTBOX_PARTITIONS": "six",
            },
            "OUTBOX_PARTITIONS='six' is not a valid int",
        ),
        (
            {
                "OUTBOX_BOOTSTRAP_SERVERS": "k",
                "OUTBOX_PRODUCER_GROUP": "g",
                "OUTBOX_PARTITIONS": "0",
            },
            "partitions=0 must be at least 1",
        ),
    ],
)
def test_bad_settings_name_the_variable_and_the_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        OutboxSettings.from_env(env)


def test_the_checker_refuses_to_run_unsigned_unless_told_it_is_local() -> None:
    with pytest.raises(ConfigurationError, match="OUTBOX_CHECKER_SECRET"):
        CheckerSettings.from_env({"OUTBOX_BOOTSTRAP_SERVERS": "k"})
    with pytest.raises(ConfigurationError, match="not a boolean"):
        CheckerSettings.from_env(
            {"OUTBOX_BOOTSTRAP_SERVERS": "k", "OUTBOX_CHECKER_INSECURE_LOCAL": "maybe"}
        )
