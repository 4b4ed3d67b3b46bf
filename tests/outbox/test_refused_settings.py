"""A relay or checker whose consumer the broker's group coordinator refuses to let join
(``session.timeout.ms`` outside the broker's range) ends with the setting named, in the library,
under ``python -m`` and under ``kafka-outbox`` (:mod:`outbox.refused_settings`).

Before, each ran on and never joined: the relay logged "consumer error: JoinGroup failed" every
2 s, the checker nothing at all, and neither ever promoted or checked anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from checker import Checker
from outbox import OutboxSettings
from outbox.errors import ConfigurationError
from outbox.refused_settings import RefusedSettings
from relay import Relay
from relay.settings import RelaySettings
from tests.checker.test_checker import checker_settings
from tests.kafka_helpers import unique
from tests.outbox_cli.conftest import KEEP

#: Below the broker's default group.min.session.timeout.ms (6000).
REFUSED_MS = 3000


def test_an_invalid_session_timeout_names_the_value_and_the_variable() -> None:
    refused = RefusedSettings({"session.timeout.ms": REFUSED_MS}, "OUTBOX_RELAY_")
    error = refused.error_for(KafkaError(KafkaError.INVALID_SESSION_TIMEOUT))
    assert isinstance(error, ConfigurationError)
    assert "session.timeout.ms (3000 ms)" in str(error)
    assert "OUTBOX_RELAY_KAFKA__SESSION_TIMEOUT_MS" in str(error)
    assert "group.min.session.timeout.ms" in str(error)


def test_librdkafkas_default_is_named_when_nothing_set_it() -> None:
    error = RefusedSettings({}, "OUTBOX_CHECKER_").error_for(
        KafkaError(KafkaError.INVALID_SESSION_TIMEOUT)
    )
    assert error is not None and "(45000 ms)" in str(error)


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.GROUP_AUTHORIZATION_FAILED,  # an ACL granted later passes it
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.INCONSISTENT_GROUP_PROTOCOL,  # a rolling change of the assignor passes
    ],
)
def test_errors_a_retry_or_a_change_elsewhere_may_pass_are_not_refusals(code: int) -> None:
    assert RefusedSettings({}, "OUTBOX_RELAY_").error_for(KafkaError(code)) is None


def _raised_within(run: Callable[[], None], close: Callable[[], None], timeout: float) -> object:
    """What ``run()`` raised within ``timeout`` s, or "still running" (then it is closed)."""
    outcome: list[object] = []

    def target() -> None:
        try:
            run()
            outcome.append("returned")
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        close()
        thread.join(30)
        return "still running"
    return outcome[0]


@pytest.mark.integration
def test_a_relay_whose_session_timeout_the_broker_refuses_raises_naming_it(
    kafka_bootstrap: str, outbox_settings: OutboxSettings
) -> None:
    relay = Relay(
        RelaySettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=outbox_settings.topic_prefix,
            group_id=unique("relay"),
            kafka={"session.timeout.ms": REFUSED_MS},
        )
    )
    started = time.monotonic()
    raised = _raised_within(relay.run, relay.close, timeout=60)
    assert isinstance(raised, ConfigurationError), raised
    assert "session.timeout.ms (3000 ms)" in str(raised)
    assert time.monotonic() - started < 30
    assert relay.sessions == 1  # not started over


@pytest.mark.integration
def test_a_checker_whose_session_timeout_the_broker_refuses_raises_naming_it(
    kafka_bootstrap: str, outbox_settings: OutboxSettings
) -> None:
    checker = Checker(
        checker_settings(
            kafka_bootstrap,
            outbox_settings.topic_prefix,
            kafka={"session.timeout.ms": REFUSED_MS},
        )
    )
    started = time.monotonic()
    raised = _raised_within(checker.run, checker.close, timeout=60)
    assert isinstance(raised, ConfigurationError), raised
    assert "OUTBOX_CHECKER_KAFKA__SESSION_TIMEOUT_MS" in str(raised)
    assert time.monotonic() - started < 30
    assert checker.sessions == 1


@pytest.mark.integration
@pytest.mark.parametrize(
    "command",
    [["-m", "relay"], ["-m", "checker"], ["-m", "outbox_cli", "relay"]],
    ids=["python -m relay", "python -m checker", "kafka-outbox relay"],
)
def test_the_service_commands_exit_2_with_one_line_naming_the_setting(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, command: list[str], tmp_path: Path
) -> None:
    service = "checker" if "checker" in command else "relay"
    prefix = f"OUTBOX_{service.upper()}_"
    env = {
        **{
            k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_") or k.startswith(KEEP)
        },
        "PYTHONPATH": str(Path(__file__).parents[2]),
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        f"{prefix}TOPIC_PREFIX": outbox_settings.topic_prefix,
        f"{prefix}GROUP_ID": unique(service),
        f"{prefix}HTTP_PORT": "0",
        f"{prefix}KAFKA__SESSION_TIMEOUT_MS": str(REFUSED_MS),
        "OUTBOX_CHECK_SECRET": "s" * 32,
    }
    done = subprocess.run(
        [sys.executable, *command], env=env, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"{prefix}KAFKA__SESSION_TIMEOUT_MS" in last and "(3000 ms)" in last, done.stderr
