"""librdkafka's log lines from the library's Kafka clients come through Python logging
(``outbox.librdkafka``), never raw on stderr (unit: the clients point at a port nobody listens
on, so librdkafka logs its refused connections)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

import pytest

from checker.instances import LiveInstances
from outbox import OutboxProducer, OutboxSettings, ensure_topics
from outbox.errors import KafkaOperationError
from outbox.fetch import HalfFetcher
from outbox.kafka_logging import LOGGER_NAME, SYSLOG_LEVELS, LibrdkafkaLogger, log_to_python
from outbox.testing.ports import free_port

#: A librdkafka line as it writes it to stderr by itself: ``%3|1700000000.123|FAIL|...``.
RAW = re.compile(r"^%\d\|")


def refused(records: list[logging.LogRecord], port: int) -> list[logging.LogRecord]:
    return [r for r in records if f":{port}" in r.getMessage() and "refused" in r.getMessage()]


def wait_for_refused(
    caplog: pytest.LogCaptureFixture, port: int, serve: Callable[[], object] = lambda: None
) -> list[logging.LogRecord]:
    """The records of ``port``'s refused connections, once there are some (``serve`` is what
    hands a client's queued lines over, for the clients nobody else serves)."""
    deadline = time.monotonic() + 15
    while not (found := refused(caplog.records, port)):
        assert time.monotonic() < deadline, "no librdkafka line reached logging"
        serve()
        time.sleep(0.1)
    return found


def run_producer(settings: OutboxSettings, caplog: pytest.LogCaptureFixture) -> None:
    producer = OutboxProducer(settings)  # its poll threads serve the lines
    try:
        wait_for_refused(caplog, port_of(settings))
    finally:
        producer.close(timeout=0.5)


def run_fetcher(settings: OutboxSettings, caplog: pytest.LogCaptureFixture) -> None:
    fetcher = HalfFetcher({"bootstrap.servers": settings.bootstrap_servers}, "half", timeout_s=1)
    try:
        with pytest.raises(KafkaOperationError):
            fetcher.fetch(0, [0], "t1")  # its reads serve them
    finally:
        fetcher.close()


def run_admin(settings: OutboxSettings, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(KafkaOperationError, match="cannot list topics"):
        ensure_topics(settings, timeout=1)  # polled before it goes


def run_registry_reader(settings: OutboxSettings, caplog: pytest.LogCaptureFixture) -> None:
    instances = LiveInstances({"bootstrap.servers": settings.bootstrap_servers}, "registry", 10)
    try:
        wait_for_refused(caplog, port_of(settings), serve=instances.poll)
    finally:
        instances.close()


def raw_lines(err: str, port: int) -> list[str]:
    """librdkafka's own stderr lines about ``port`` (another test's client may write others)."""
    return [line for line in err.splitlines() if RAW.match(line) and f":{port}" in line]


def port_of(settings: OutboxSettings) -> int:
    return int(settings.bootstrap_servers.rsplit(":", 1)[1])


@pytest.mark.parametrize(
    "run",
    [run_producer, run_fetcher, run_admin, run_registry_reader],
    ids=["producer", "half fetcher", "admin client", "checker's registry reader"],
)
def test_librdkafka_lines_reach_python_logging_as_warnings_and_nothing_raw_reaches_stderr(
    run: Callable[[OutboxSettings, pytest.LogCaptureFixture], None],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Given a library client whose broker refuses connections
    port = free_port()
    settings = OutboxSettings(bootstrap_servers=f"127.0.0.1:{port}", producer_group="g")
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    # When it has tried to connect
    run(settings, caplog)
    # Then librdkafka's lines are records of outbox.librdkafka: its ERR a WARNING
    found = refused(caplog.records, port)
    assert found, "no librdkafka line reached logging"
    assert {r.name for r in found} == {LOGGER_NAME}
    assert {r.levelno for r in found} == {logging.WARNING}
    assert "FAIL" in found[0].getMessage()
    # And none was written to stderr by librdkafka itself
    assert raw_lines(capfd.readouterr().err, port) == []


def test_a_users_own_logger_in_the_kafka_settings_wins(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    mine = logging.getLogger("tests.my_librdkafka")
    settings = OutboxSettings(
        bootstrap_servers=f"127.0.0.1:{port}", producer_group="g", kafka={"logger": mine}
    )
    caplog.set_level(logging.DEBUG)
    run_producer(settings, caplog)
    found = refused(caplog.records, port)
    assert {r.name for r in found} == {"tests.my_librdkafka"}
    assert {r.levelno for r in found} == {logging.ERROR}  # confluent-kafka's levels, as given
    assert log_to_python({"logger": mine})["logger"] is mine
    assert raw_lines(capfd.readouterr().err, port) == []


@pytest.mark.parametrize(
    ("syslog", "given", "logged"),
    [
        (2, logging.CRITICAL, logging.CRITICAL),
        (3, logging.ERROR, logging.WARNING),  # what librdkafka retries by itself
        (4, logging.WARNING, logging.WARNING),
        (6, logging.INFO, logging.INFO),
        (7, logging.DEBUG, logging.INFO),  # only for the debug contexts a user asked for
    ],
)
def test_librdkafkas_levels_as_confluent_kafka_hands_them_over_are_logged_at_ours(
    syslog: int, given: int, logged: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tests.levels")
    LibrdkafkaLogger(logging.getLogger("tests.levels")).log(
        given, "%s [%s] %s", "FAC", "rdkafka#producer-1", "a line"
    )
    [record] = caplog.records
    assert record.levelno == logged == SYSLOG_LEVELS[syslog]
    assert record.getMessage() == "FAC [rdkafka#producer-1] a line"
