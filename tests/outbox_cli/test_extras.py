"""``kafka-outbox demo`` and ``kafka-outbox audit``: the commands that hand over to other code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from outbox import OutboxSettings
from outbox.protocol import OpState
from tests.kafka_helpers import create_topic, unique
from tests.outbox_cli.conftest import KEEP, Cli
from tests.outbox_cli.records import Writer


@pytest.mark.processes
@pytest.mark.integration
def test_demo_runs_make_demo_s_driver_end_to_end_and_its_verdict_is_its_last_line() -> None:
    # In a process of its own, as a terminal shows it: stdout and stderr in one stream, in order,
    # up to the process's exit (a Kafka client left open would speak after the broker stopped)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_") or k.startswith(KEEP)}
    demo = ["demo", "--orders", "40", "--workers", "2", "--timeout", "60"]
    done = subprocess.run(
        [sys.executable, "-m", "outbox_cli", *demo],
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-6000:]
    assert lines[-1].startswith("CONSISTENT: every committed order delivered exactly once"), (
        done.stdout[-3000:]
    )
    # librdkafka's lines went through Python logging, none raw (%3|...|FAIL|...) on the terminal
    assert [line for line in lines if re.match(r"%\d\|", line)] == [], done.stdout[-3000:]


def test_demo_passes_its_arguments_through_help_included(cli: Cli) -> None:
    result = cli("demo", "--help")
    assert result.code == 0
    assert "--orders" in result.out and "--decline-share" in result.out
    assert cli("demo", "--orders", "many").code == 2


def test_audit_without_the_audit_module_says_what_to_install(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "checker.audit.cli", None)  # as if not installed
    result = cli("audit", "--help")
    assert result.code == 2
    assert "install kafka-outbox[audit]" in result.err


def test_audit_passes_its_arguments_and_help_through(cli: Cli) -> None:
    result = cli("audit", "--help")
    assert result.code == 0
    assert result.out.startswith("usage: kafka-outbox audit") and "--from" in result.out
    bad = cli("audit", "--bootstrap-servers", "k:1", "--from", "tomorrow")
    assert bad.code == 2 and "--from" in bad.err


@pytest.mark.integration
def test_audit_finds_a_committed_message_that_never_reached_its_topic_and_exits_1(
    cli: Cli, kafka_bootstrap: str, outbox_settings: OutboxSettings, tmp_path: Path, spark: object
) -> None:
    # Given a committed transaction that the relay never promoted (no relay runs here)
    topic = unique("orders-audit-cli")
    create_topic(kafka_bootstrap, topic)
    writer = Writer(outbox_settings)
    txn = writer.halves(topic, [b"never-delivered"])
    writer.op(txn, OpState.COMMIT)
    # When the audit runs through the console script (on the session's Spark), its settings from
    # OUTBOX_AUDIT_* variables and its own arguments
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_AUDIT_TOPIC_PREFIX": outbox_settings.topic_prefix,
        "OUTBOX_AUDIT_OUT_DIR": str(tmp_path / "audit"),
    }
    result = cli("audit", "--grace", "0s", "--quiet", env=env)
    # Then it reports the violation with exit code 1 and writes its report
    assert result.code == 1, result.out[-3000:] + result.err[-3000:]
    assert "audit VIOLATIONS" in result.out
    assert (tmp_path / "audit").is_dir()
