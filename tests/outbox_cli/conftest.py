"""Running ``kafka-outbox`` in-process (``outbox_cli.main.main``) with its own environment."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from outbox import OutboxSettings
from outbox.testing.ports import free_port
from outbox_cli.main import main

#: Harness variables share the prefix; everything else OUTBOX_* is cleared for each test.
KEEP = ("OUTBOX_TEST_", "OUTBOX_CACHE_DIR")


@dataclass
class Result:
    code: int
    out: str
    err: str


Cli = Callable[..., Result]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """``cli("status", "--json", env={...})`` -> Result(exit code, stdout, stderr)."""
    for variable in [v for v in os.environ if v.startswith("OUTBOX_") and not v.startswith(KEEP)]:
        monkeypatch.delenv(variable)
    monkeypatch.delenv("OUTBOX_CONFIG_FILE", raising=False)  # --config sets it; undone after

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


@pytest.fixture
def operator_env(kafka_bootstrap: str, outbox_settings: OutboxSettings) -> dict[str, str]:
    """The variables an operator's shell has: where Kafka is, which topics."""
    return {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_TOPIC_PREFIX": outbox_settings.topic_prefix,
        "OUTBOX_PARTITIONS": str(outbox_settings.partitions),
    }


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on: an unreachable broker or database."""
    return free_port()
