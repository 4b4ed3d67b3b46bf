"""``kafka-outbox relay`` and ``kafka-outbox checker`` as the processes an orchestrator starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from outbox import LocalTransactionState, OutboxProducer, OutboxSettings
from outbox.checks.listener import FunctionResolver
from outbox.protocol import DecidedBy, OpState, decode_op
from outbox.testing.ports import free_port
from tests.kafka_helpers import create_topic, unique
from tests.outbox_cli.conftest import KEEP, Cli
from tests.outbox_cli.records import Writer, read_messages

pytestmark = pytest.mark.integration
SECRET = "cli-services-test-secret"


def wait_for(predicate: Callable[[], bool], timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


@contextmanager
def service(command: str, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``kafka-outbox COMMAND`` in its own process; SIGTERM at the end must exit it with 0."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_") or k.startswith(KEEP)
    }
    script = Path(sys.executable).parent / "kafka-outbox"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(script), command], env={**clean, **env}, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            yield process
            assert process.poll() is None, f"{command} exited early:\n{log.read_text()[-3000:]}"
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, (
                f"{command} did not stop cleanly:\n{log.read_text()[-3000:]}"
            )
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)


def test_the_relay_command_promotes_a_committed_transaction_and_answers_its_probes(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, tmp_path: Path
) -> None:
    topic = unique("orders-relay-cli")
    create_topic(kafka_bootstrap, topic)
    port = free_port()
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_RELAY_TOPIC_PREFIX": outbox_settings.topic_prefix,
        "OUTBOX_RELAY_GROUP_ID": unique("relay-cli"),
        "OUTBOX_RELAY_HTTP_PORT": str(port),
    }
    with service("relay", env, tmp_path / "relay.log"):
        # Given a committed transaction on the internal topics
        writer = Writer(outbox_settings)
        txn = writer.halves(topic, [b"placed", b"paid"])
        writer.op(txn, OpState.COMMIT)
        # Then the relay started by the console script promotes it, and says it is ready
        wait_for(
            lambda: (
                [m.value() for m in read_messages(kafka_bootstrap, topic)] == [b"placed", b"paid"]
            ),
            what="the promoted messages",
        )
        wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, what="/readyz")
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        status, metrics = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "outbox_relay_promoted_total" in metrics


def test_the_checker_command_resolves_a_transaction_whose_op_was_lost(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_CHECKER_TOPIC_PREFIX": outbox_settings.topic_prefix,
        "OUTBOX_CHECKER_GROUP_ID": unique("checker-cli"),
        "OUTBOX_CHECK_SECRET": SECRET,
        "OUTBOX_CHECKER_TRANSACTION_TIMEOUT_S": "1",
        "OUTBOX_CHECKER_CHECK_INTERVAL_S": "1",
        "OUTBOX_CHECKER_HTTP_PORT": str(port),
    }
    # Given a producer whose check endpoint answers COMMIT, and a transaction with no op
    with OutboxProducer(outbox_settings) as producer:
        producer.serve_checks(
            resolver=FunctionResolver(lambda txn_id: LocalTransactionState.COMMIT), secret=SECRET
        )
        txn = Writer(outbox_settings, group=outbox_settings.producer_group).halves(
            "orders", [b"lost-op"]
        )

        def decided() -> list:
            return [
                op
                for m in read_messages(kafka_bootstrap, outbox_settings.topics.op, txn.partition)
                if (op := decode_op(m.key(), m.value())) is not None and op.txn_id == txn.txn_id
            ]

        with service("checker", env, tmp_path / "checker.log"):
            # Then the checker started by the console script asks and writes the COMMIT
            wait_for(lambda: bool(decided()), what="the checker's op")
            [op] = decided()
            assert (op.state, op.decided_by) == (OpState.COMMIT, DecidedBy.CHECKER)
            wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 20, "/readyz")
            status, metrics = get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200 and "outbox_checker_resolved_commit" in metrics


@pytest.mark.parametrize(
    ("command", "env", "message"),
    [
        (
            "relay",
            {"OUTBOX_RELAY_BATCH_MAX_RECORDS": "0"},
            "batch_max_records=0 must be at least 1",
        ),
        (
            "relay",
            {"OUTBOX_RELAY_BATCH_MAX_RECORDS": "1000001"},
            "batch_max_records=1000001 must be at most 1,000,000",
        ),
        ("relay", {"OUTBOX_RELAY_HTTP_PORT": "http"}, "OUTBOX_RELAY_HTTP_PORT='http' is not"),
        ("checker", {}, "set OUTBOX_CHECK_SECRET"),
        ("checker", {"OUTBOX_CHECK_SECRET": "s", "OUTBOX_CHECKER_CHECK_MAX": "x"}, "CHECK_MAX"),
        (
            "checker",
            {"OUTBOX_CHECK_SECRET": "s", "OUTBOX_CHECKER_STUCK_EXIT_S": "-5"},
            "stuck_exit_s=-5.0 must be 0 (off) or more",
        ),
        # NaN parses as a float; in a wait or a deadline it never ends or ends at once
        ("relay", {"OUTBOX_RELAY_COMMIT_INTERVAL_S": "nan"}, "commit_interval_s=nan must be"),
        ("relay", {"OUTBOX_RELAY_STUCK_EXIT_S": "inf"}, "stuck_exit_s=inf must be 0 (off) or"),
        # negative or NaN turned the restart and park-retry waits into hot loops
        ("relay", {"OUTBOX_RELAY_RETRY_BACKOFF_S": "-1"}, "retry_backoff_s=-1.0 must be"),
        ("relay", {"OUTBOX_RELAY_PARK_RETRY_S": "nan"}, "park_retry_s=nan must be"),
        (
            "checker",
            {"OUTBOX_CHECK_SECRET": "s", "OUTBOX_CHECKER_CLOCK_SLACK_S": "nan"},
            "clock_slack_s=nan must be 0 or more",
        ),
        (
            "checker",
            {"OUTBOX_CHECK_SECRET": "s", "OUTBOX_CHECKER_CHECK_INTERVAL_S": "nan"},
            "check_interval_s=nan must be a positive number of seconds "
            "(OUTBOX_CHECKER_CHECK_INTERVAL_S)",
        ),
        *(
            (
                "checker",
                {"OUTBOX_CHECK_SECRET": "s", f"OUTBOX_CHECKER_{name.upper()}": value},
                f"{name}={value} must be a positive number of seconds",
            )
            # 0 gave up a transaction whose group had no live instance at its first check at
            # once; inf / nan ended rounds in an exception or paused a group for ever
            for name, value in [
                ("no_producer_timeout_s", "0.0"),
                ("no_producer_timeout_s", "-1.0"),
                ("no_producer_timeout_s", "inf"),
                ("transaction_timeout_s", "nan"),
                ("breaker_cooldown_s", "inf"),
                ("breaker_cooldown_s", "nan"),
            ]
        ),
    ],
)
def test_a_service_with_an_invalid_setting_exits_2_naming_it(
    cli: Cli, command: str, env: dict[str, str], message: str
) -> None:
    result = cli(command, env={"OUTBOX_BOOTSTRAP_SERVERS": "127.0.0.1:9", **env})
    assert result.code == 2
    assert result.err.startswith("kafka-outbox: error: ") and message in result.err
    assert result.err.count("\n") == 1


@pytest.mark.parametrize("command", ["relay", "checker"])
def test_a_service_that_cannot_reach_kafka_exits_3(
    cli: Cli, command: str, unused_port: int
) -> None:
    env = {"OUTBOX_BOOTSTRAP_SERVERS": f"127.0.0.1:{unused_port}", "OUTBOX_CHECK_SECRET": "s"}
    result = cli("--timeout", "2s", command, env=env)
    assert result.code == 3
    assert f"cannot reach Kafka at 127.0.0.1:{unused_port}" in result.err


@pytest.mark.parametrize("command", ["relay", "checker"])
def test_a_service_whose_topics_do_not_exist_exits_1_saying_how_to_create_them(
    cli: Cli, command: str, kafka_bootstrap: str
) -> None:
    prefix = unique("__absent")
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        f"OUTBOX_{command.upper()}_TOPIC_PREFIX": prefix,
        "OUTBOX_CHECK_SECRET": "s",
    }
    result = cli(command, env=env)
    assert result.code == 1
    assert f"topics {prefix}-half" in result.err and "kafka-outbox topics ensure" in result.err
