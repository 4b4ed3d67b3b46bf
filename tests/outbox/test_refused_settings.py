"""A relay or checker whose kafka settings are refused for good ends with the setting named, in
the library, under ``python -m`` and under ``kafka-outbox`` (:mod:`outbox.refused_settings`):
refused by the brokers (a ``session.timeout.ms`` outside their range: the group never lets the
member join) or by librdkafka (an unknown key, a session timeout above ``max.poll.interval.ms``).

Before, each ran on for ever: refused by the brokers, the relay logged "consumer error: JoinGroup
failed" every 2 s and the checker nothing at all; refused by librdkafka, each started a new
session every second, and the relay's first one crashed it with a traceback.
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
from confluent_kafka import Consumer, KafkaError, KafkaException

from checker import Checker
from outbox import OutboxSettings
from outbox.errors import ConfigurationError
from outbox.refused_settings import RefusedSettings, refusing_client_settings
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
    assert "group.min.session.timeout.ms" in str(error) and "max.poll.interval.ms" in str(error)


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


def test_librdkafka_refusing_to_make_a_client_is_a_configuration_error() -> None:
    refused = pytest.raises(ConfigurationError, match=r'No such configuration property: "foo.bar"')
    with refused as raised, refusing_client_settings("OUTBOX_RELAY_"):
        Consumer({"group.id": "g", "foo.bar": 1})
    assert "fix or remove OUTBOX_RELAY_KAFKA__FOO_BAR" in str(raised.value)
    with pytest.raises(KafkaException), refusing_client_settings("OUTBOX_RELAY_"):
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))  # any other: as it was


@pytest.mark.parametrize(
    "unreadable",
    [{"ssl.ca.location": "/nonexistent/ca"}, {"ssl.keystore.location": "/nonexistent/ks"}],
    ids=["ca", "keystore"],
)
def test_a_file_an_ssl_setting_names_is_not_refused_for_good(unreadable: dict[str, str]) -> None:
    """A certificate being rotated may be readable at the next try: tried again, as before."""
    # Given settings naming a file librdkafka cannot read
    config = {"group.id": "g", "security.protocol": "ssl", "ssl.keystore.password": "x"}
    # Then making a client of them fails as it did, for the session to be tried again
    with pytest.raises(KafkaException) as raised, refusing_client_settings("OUTBOX_RELAY_"):
        Consumer({**config, **unreadable})
    assert raised.value.args[0].code() == KafkaError._INVALID_ARG


@pytest.mark.parametrize(
    ("misspelt", "named"),
    [
        ({"security.protocol": "sasl_plaintxt"}, "OUTBOX_KAFKA__SECURITY_PROTOCOL"),
        ({"ssl.bogus": "1"}, "OUTBOX_KAFKA__SSL_BOGUS"),
        ({"security.protocol": "sasl_plaintext", "sasl.mechanism": "PLAN"}, "SASL mechanism"),
        ({"security.protocol": "sasl_plaintext", "sasl.mechanism": "PLAIN"}, "sasl.username"),
    ],
    ids=["protocol", "unknown ssl key", "mechanism", "no credentials"],
)
def test_a_misspelt_security_setting_is_refused_for_good(
    misspelt: dict[str, str], named: str
) -> None:
    """Only a file librdkafka could not read is tried again, not every ssl. or sasl. refusal."""
    with pytest.raises(ConfigurationError, match=named), refusing_client_settings("OUTBOX_"):
        Consumer({"group.id": "g", **misspelt})


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


#: kafka settings refused for good, and what the error names.
REFUSED = [
    pytest.param({"session.timeout.ms": REFUSED_MS}, "(3000 ms)", id="by the brokers"),
    pytest.param({"session.timeout.ms": 400_000}, "max.poll.interval.ms", id="above max.poll"),
    pytest.param({"foo.bar": 1}, "KAFKA__FOO_BAR", id="unknown key"),
    pytest.param(
        {"session.timeout.ms": "soon"},
        "KAFKA__SESSION_TIMEOUT_MS",
        id="a value that does not parse",
    ),
]


@pytest.mark.integration
@pytest.mark.parametrize(("kafka", "named"), REFUSED)
def test_a_relay_whose_kafka_settings_are_refused_raises_naming_them(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, kafka: dict[str, object], named: str
) -> None:
    relay = Relay(
        RelaySettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=outbox_settings.topic_prefix,
            group_id=unique("relay"),
            kafka=kafka,
        )
    )
    started = time.monotonic()
    raised = _raised_within(relay.run, relay.close, timeout=60)
    assert isinstance(raised, ConfigurationError), raised
    assert named in str(raised) and "OUTBOX_RELAY_KAFKA__" in str(raised)
    assert raised.__context__ is None  # as text: the session's clients are not kept
    assert time.monotonic() - started < 30
    assert relay.sessions == 1  # not started over
    assert relay.ready()[0] is False


@pytest.mark.integration
@pytest.mark.parametrize(("kafka", "named"), REFUSED)
def test_a_checker_whose_kafka_settings_are_refused_raises_naming_them(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, kafka: dict[str, object], named: str
) -> None:
    checker = Checker(checker_settings(kafka_bootstrap, outbox_settings.topic_prefix, kafka=kafka))
    started = time.monotonic()
    raised = _raised_within(checker.run, checker.close, timeout=60)
    assert isinstance(raised, ConfigurationError), raised
    assert named in str(raised) and "OUTBOX_CHECKER_KAFKA__" in str(raised)
    assert raised.__context__ is None
    assert time.monotonic() - started < 30
    assert checker.sessions == 1
    assert checker.ready()[0] is False


SCRIPT = str(Path(sys.executable).parent / "kafka-outbox")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("command", "key", "value", "named"),
    [
        ([sys.executable, "-m", "relay"], "SESSION_TIMEOUT_MS", str(REFUSED_MS), "(3000 ms)"),
        ([sys.executable, "-m", "checker"], "SESSION_TIMEOUT_MS", str(REFUSED_MS), "(3000 ms)"),
        ([SCRIPT, "relay"], "SESSION_TIMEOUT_MS", str(REFUSED_MS), "(3000 ms)"),
        ([SCRIPT, "checker"], "FOO_BAR", "1", '"foo.bar"'),
    ],
    ids=["python -m relay", "python -m checker", "kafka-outbox relay", "kafka-outbox checker"],
)
def test_the_service_commands_exit_2_with_one_line_naming_the_setting(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    command: list[str],
    key: str,
    value: str,
    named: str,
) -> None:
    service = "checker" if "checker" in command else "relay"
    prefix = f"OUTBOX_{service.upper()}_"
    kept = {
        k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_") or k.startswith(KEEP)
    }
    env = {
        **kept,
        "PYTHONPATH": str(Path(__file__).parents[2]),
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        f"{prefix}TOPIC_PREFIX": outbox_settings.topic_prefix,
        f"{prefix}GROUP_ID": unique(service),
        f"{prefix}HTTP_PORT": "0",
        f"{prefix}KAFKA__{key}": value,
        "OUTBOX_CHECK_SECRET": "s" * 32,
    }
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"{prefix}KAFKA__" in last and named in last, done.stderr
