"""librdkafka's log lines from the library's Kafka clients come through Python logging
(``outbox.librdkafka``), never raw on stderr (unit: the clients point at a port nobody listens
on, so librdkafka logs its refused connections)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from checker.instances import LiveInstances
from outbox import OutboxProducer, OutboxSettings, ensure_topics
from outbox.errors import KafkaOperationError
from outbox.fetch import HalfFetcher
from outbox.kafka_logging import (
    LOGGER_NAME,
    REPEAT_WINDOW_S,
    SYSLOG_LEVELS,
    LibrdkafkaLogger,
    log_to_python,
)
from outbox.log_repeats import Repeats
from outbox.testing.ports import free_port
from tests.fake_clock import Clock

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


def refusal(after_ms: int = 0, port: int = 1) -> str:
    return (
        f"[thrd:127.0.0.1:{port}/bootstrap]: 127.0.0.1:{port}/bootstrap: Connect to "
        f"ipv4#127.0.0.1:{port} failed: Connection refused (after {after_ms}ms in state CONNECT)"
    )


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def fail(log: LibrdkafkaLogger, text: str, client: str = "rdkafka#consumer-1") -> None:
    log.log(logging.ERROR, "%s [%s] %s", "FAIL", client, text)


class Scheduled:
    """A schedule the test runs itself: the sweeps the logger asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Callable[[], None]]] = []

    def __call__(self, delay_s: float, call: Callable[[], None]) -> None:
        self.calls.append((delay_s, call))

    def run(self) -> None:
        calls, self.calls = self.calls, []
        for _, call in calls:
            call()


@pytest.fixture
def scheduled() -> Scheduled:
    return Scheduled()


@pytest.fixture
def clocked(
    caplog: pytest.LogCaptureFixture, scheduled: Scheduled
) -> tuple[LibrdkafkaLogger, Clock]:
    caplog.set_level(logging.DEBUG, logger="tests.repeats")
    clock = Clock()
    logger = logging.getLogger("tests.repeats")
    return LibrdkafkaLogger(logger, Repeats(60, clock), scheduled), clock


def test_a_repeated_line_is_counted_not_logged_and_the_count_comes_with_the_next_after_the_window(
    clocked: tuple[LibrdkafkaLogger, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, clock = clocked
    # Given a client retrying its refused connection every 50 ms for 90 s (durations vary)
    for n in range(1800):
        clock.now = 1000 + n * 0.05
        fail(log, refusal(after_ms=n % 3))
    # Then the first is logged, and the first a window later with the count of those between
    assert logged(caplog) == [
        f"FAIL [rdkafka#consumer-1] {refusal()}",
        f"FAIL [rdkafka#consumer-1] {refusal(after_ms=1200 % 3)} (1199 like it in the 60.0 s "
        "before, not logged)",
    ]
    assert {r.levelno for r in caplog.records} == {logging.WARNING}


def test_lines_of_another_client_facility_level_or_broker_are_logged_each(
    clocked: tuple[LibrdkafkaLogger, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, _ = clocked
    lines = [
        (logging.ERROR, "FAIL", "rdkafka#consumer-1", refusal()),
        (logging.ERROR, "FAIL", "rdkafka#consumer-2", refusal()),  # another client
        (logging.ERROR, "ERROR", "rdkafka#consumer-1", refusal()),  # another facility
        (logging.INFO, "FAIL", "rdkafka#consumer-1", refusal()),  # another level
        (logging.ERROR, "FAIL", "rdkafka#consumer-1", refusal(port=2)),  # another broker
    ]
    for level, facility, client, text in lines * 3:
        log.log(level, "%s [%s] %s", facility, client, text)
    assert logged(caplog) == [f"{f} [{c}] {t}" for _, f, c, t in lines]


@pytest.mark.parametrize("burst", [1, 500])
def test_a_kind_that_stopped_repeating_has_its_count_logged_with_its_last_line_and_its_age(
    burst: int,
    clocked: tuple[LibrdkafkaLogger, Clock],
    scheduled: Scheduled,
    caplog: pytest.LogCaptureFixture,
) -> None:
    log, clock = clocked
    # Given a line, then a burst of lines like it within 2 s (served late, all at once)
    fail(log, refusal())
    for n in range(burst):
        clock.now = 1001 + n / 500
        fail(log, refusal(after_ms=7))
    last_at = clock.now
    # When nothing like it comes for a window and a bit, and the sweep asked for runs
    assert [delay for delay, _ in scheduled.calls] == [60]  # one, though many were counted
    clock.now = last_at + 61.25
    scheduled.run()
    # Then its last line is logged with the count, the span and how long ago it came
    assert logged(caplog) == [
        f"FAIL [rdkafka#consumer-1] {refusal()}",
        f"FAIL [rdkafka#consumer-1] {refusal(after_ms=7)} (held back: {burst} like it in the "
        f"{last_at - 1000:.1f} s after the one logged; the last 61.2 s ago)",
    ]
    # And it was forgotten: the next like it is logged as it comes
    fail(log, refusal())
    assert logged(caplog)[-1] == f"FAIL [rdkafka#consumer-1] {refusal()}"
    assert scheduled.calls == []  # nothing held: no sweep asked for


def test_a_kind_still_repeating_is_not_taken_for_stopped_when_another_kind_sweeps(
    clocked: tuple[LibrdkafkaLogger, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, clock = clocked
    # Given two clients retrying, every 50 ms and every 70 ms, for 130 s
    for n in range(2600):
        clock.now = 1000 + n * 0.05
        fail(log, refusal(), client="rdkafka#consumer-1")
        if n % 7 == 0:
            clock.now += 0.02
            fail(log, refusal(), client="rdkafka#consumer-2")
    # Then each logged its first line and one a window later, and again, with its count: none
    # of them a stopped kind's count
    messages = logged(caplog)
    assert not [m for m in messages if "held back" in m], messages
    for client in ("rdkafka#consumer-1", "rdkafka#consumer-2"):
        assert len([m for m in messages if client in m]) == 3, messages


def test_the_timer_logs_a_stopped_kinds_count_though_no_line_follows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="tests.timer")
    log = LibrdkafkaLogger(logging.getLogger("tests.timer"), Repeats(0.3))
    # Given three lines alike, then nothing
    for _ in range(3):
        fail(log, refusal())
    # Then within a window or two the count of the two not logged is
    deadline = time.monotonic() + 5
    while len(caplog.records) < 2:
        assert time.monotonic() < deadline, logged(caplog)
        time.sleep(0.05)
    assert "(held back: 2 like it in the 0.0 s after the one logged; the last" in logged(caplog)[1]
    assert caplog.records[1].threadName == "outbox-librdkafka-repeats"


def test_what_repeats_keeps_is_bounded_by_what_the_last_two_windows_brought() -> None:
    clock = Clock()
    repeats = Repeats(60, clock)
    # Given 10,000 clients come and go, each logging one line, over ten minutes
    for n in range(10_000):
        clock.now = 1000 + n * 0.06
        repeats.admit(("FAIL", n), logging.WARNING, ("FAIL", f"rdkafka#consumer-{n}", "x"))
        # Then it never keeps more kinds than two windows of them brought
        assert len(repeats) <= 2 * 60 / 0.06 + 1


@pytest.mark.parametrize("level", [logging.DEBUG, logging.CRITICAL])
def test_debug_lines_a_user_asked_for_and_critical_ones_are_all_logged(
    level: int, clocked: tuple[LibrdkafkaLogger, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, _ = clocked
    for _ in range(5):
        log.log(level, "%s [%s] %s", "RECONNECT", "rdkafka#consumer-1", "Delaying 50ms")
    assert len(caplog.records) == 5


def test_at_exit_every_count_still_held_is_logged(
    clocked: tuple[LibrdkafkaLogger, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, clock = clocked
    for n in range(4):
        clock.now = 1000 + n
        fail(log, refusal())
    log.flush()  # a window has not passed: nothing yet
    assert len(caplog.records) == 1
    log.flush(everything=True)  # what flush_held does for the library's clients' logger
    assert logged(caplog)[1].endswith(
        "(held back: 3 like it in the 3.0 s after the one logged; the last 0.0 s ago)"
    )


class Counting(LibrdkafkaLogger):
    """The library's logger, counting the lines confluent-kafka hands it."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger)
        self.handed: list[str] = []

    def log(self, level: int, msg: str, *args: object) -> None:
        self.handed.append(msg % args)
        super().log(level, msg, *args)


#: How long the broker is away: within one window, so one line is logged.
AWAY_S = 5.0
assert AWAY_S < REPEAT_WINDOW_S


def test_a_client_whose_broker_stays_away_logs_its_refused_connection_once_in_a_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a subscribed consumer whose one broker refuses connections for AWAY_S
    port = free_port()
    caplog.set_level(logging.DEBUG, logger="tests.away")
    counting = Counting(logging.getLogger("tests.away"))
    consumer = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "g", "logger": counting}
    )
    try:
        consumer.subscribe(["t"])
        deadline = time.monotonic() + AWAY_S
        while time.monotonic() < deadline:
            consumer.poll(0.2)
    finally:
        consumer.close()
    # Then librdkafka retried many times (it does every ~50 ms with no broker up) and one line
    # of them was logged
    handed = [line for line in counting.handed if f":{port}" in line and "refused" in line]
    assert len(handed) >= 20, counting.handed
    assert len(refused(caplog.records, port)) == 1
    # And the rest are counted in one more, once they are flushed (its timer would, later)
    counting.flush(everything=True)
    rest = refused(caplog.records, port)[1].getMessage()
    assert f"(held back: {len(handed) - 1} like it in the" in rest, rest


def test_a_sweep_that_cannot_be_scheduled_is_asked_for_again_by_the_next_counted_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="tests.nothread")
    asked: list[float] = []

    def no_thread(delay_s: float, call: Callable[[], None]) -> None:
        asked.append(delay_s)
        raise RuntimeError("can't start new thread")

    log = LibrdkafkaLogger(logging.getLogger("tests.nothread"), Repeats(60), no_thread)
    for _ in range(3):
        fail(log, refusal())  # no error out of the client's poll()
    assert asked == [60, 60]  # each counted line asks again
    assert len(caplog.records) == 1
    log.flush(everything=True)
    assert "(held back: 2 like it" in logged(caplog)[1]


def test_identical_error_counts_and_durations_do_not_make_a_new_kind(
    clocked: tuple[LibrdkafkaLogger, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, _ = clocked
    for n in (1, 2, 3):
        fail(
            log,
            f"1/1: Disconnected (after {n}00ms in state UP, {n} identical error(s) suppressed)",
        )
    assert len(caplog.records) == 1


def test_a_forked_child_starts_with_nothing_held_and_counts_its_own(
    clocked: tuple[LibrdkafkaLogger, Clock], scheduled: Scheduled, tmp_path: Path
) -> None:
    log, _ = clocked
    # Given lines held back, their sweep asked for
    for _ in range(3):
        fail(log, refusal())
    assert log.repeats.holding() and len(scheduled.calls) == 1
    # and another thread inside the counting's lock as the process forks
    inside, release = threading.Event(), threading.Event()

    class Blocking:
        def __hash__(self) -> int:
            inside.set()
            release.wait(10)
            return 1

    other = threading.Thread(
        target=log.repeats.admit, args=(Blocking(), logging.WARNING, ("F", "c", "x"))
    )
    other.start()
    assert inside.wait(5)
    out = tmp_path / "child"
    pid = os.fork()
    if pid == 0:  # the child: report what it holds, count one of its own, and go
        try:
            held = log.repeats.holding()
            fail(log, refusal())  # logged again: the parent's kind is not the child's
            fail(log, refusal())  # counted, and a sweep asked for: none is pending here
            out.write_text(
                f"{held} {len(log.repeats)} {log.repeats.holding()} {len(scheduled.calls)}"
            )
        finally:
            os._exit(0)
    release.set()
    other.join()
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the child hung: a lock held at the fork stayed held")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(done[1]) == 0
    # Then the child started empty, counted its own, and asked for its own sweep
    assert out.read_text() == "False 1 True 2"
    assert log.repeats.holding()  # the parent's are its own still


def test_lines_the_logger_would_drop_are_not_counted(
    caplog: pytest.LogCaptureFixture, scheduled: Scheduled
) -> None:
    logger = logging.getLogger("tests.quiet")
    caplog.set_level(logging.ERROR, logger="tests.quiet")  # as the CLI sets it without --debug
    log = LibrdkafkaLogger(logger, Repeats(60), scheduled)
    for _ in range(3):
        fail(log, refusal())  # WARNING here
    assert caplog.records == []
    assert not log.repeats.holding() and len(log.repeats) == 0 and scheduled.calls == []


def test_at_a_normal_exit_the_library_clients_counts_are_logged() -> None:
    code = (
        "import logging\n"
        "from outbox.kafka_logging import log_to_python\n"
        "logging.basicConfig(format='%(message)s')\n"
        "log = log_to_python({})['logger']\n"
        "for _ in range(3):\n"
        "    log.log(logging.ERROR, '%s [%s] %s', 'FAIL', 'rdkafka#consumer-1', 'refused')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    lines = done.stderr.splitlines()
    assert lines[0] == "FAIL [rdkafka#consumer-1] refused", done.stderr
    assert lines[1].startswith("FAIL [rdkafka#consumer-1] refused (held back: 2 like it in the")
    assert len(lines) == 2, done.stderr


def test_an_hour_long_outage_logs_a_line_a_minute_and_keeps_one_kind(
    clocked: tuple[LibrdkafkaLogger, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    log, clock = clocked
    # Given a client refused every 50 ms for an hour: 72,000 lines
    for n in range(72_000):
        clock.now = 1000 + n * 0.05
        fail(log, refusal())
    # Then one line a minute is logged, each after the first with the 1,199 between
    messages = logged(caplog)
    assert len(messages) == 60
    assert all(m.endswith("(1199 like it in the 60.0 s before, not logged)") for m in messages[1:])
    # And one kind is all it keeps
    assert len(log.repeats) == 1
