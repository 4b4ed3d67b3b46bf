"""The command line itself: help on every level, exit codes, one-line errors, the console script."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from outbox_cli.errors import EXIT_CODES
from outbox_cli.main import build_parser
from tests.outbox_cli.conftest import Cli

COMMANDS = [
    ["topics"],
    ["topics", "ensure"],
    ["migrate"],
    ["relay"],
    ["checker"],
    ["status"],
    ["inspect"],
    ["resume"],
    ["config"],
]


@pytest.mark.parametrize("command", [[], *COMMANDS], ids=lambda c: " ".join(c) or "top")
def test_every_level_has_help_with_the_exit_codes(cli: Cli, command: list[str]) -> None:
    result = cli(*command, "--help")
    assert result.code == 0
    assert result.out.startswith(f"usage: kafka-outbox {' '.join(command)}".rstrip())
    assert "exit codes:" in result.out
    assert "4  not found" in result.out


def test_the_help_lists_every_command_and_every_exit_code(cli: Cli) -> None:
    out = cli("--help").out
    for command in ("topics", "migrate", "relay", "checker", "audit", "status", "inspect"):
        assert f"    {command} " in out
    for name in ("resume", "config", "demo"):
        assert f"    {name} " in out
    for code, _ in EXIT_CODES:
        assert f"\n  {code}  " in out


def test_bad_usage_exits_2_with_argparse_s_one_line_reason(cli: Cli) -> None:
    result = cli("status", "--since", "yesterday")
    assert result.code == 2
    assert "'yesterday' is not a duration" in result.err
    assert cli("frobnicate").code == 2
    assert cli("status", "extra-argument").code == 2


def test_global_options_work_before_and_after_the_command() -> None:
    parser = build_parser()
    before = parser.parse_args(["--timeout", "3s", "--debug", "status"])
    after = parser.parse_args(["status", "--timeout", "3s", "--debug"])
    assert (before.timeout, before.debug) == (after.timeout, after.debug) == (3.0, True)
    assert parser.parse_args(["status"]).timeout == 15.0


def test_a_missing_setting_is_one_line_naming_the_variable_and_debug_adds_the_traceback(
    cli: Cli,
) -> None:
    plain = cli("status")
    assert plain.code == 2
    assert plain.err == "kafka-outbox: error: missing settings: set OUTBOX_BOOTSTRAP_SERVERS\n"
    debug = cli("--debug", "status")
    assert debug.code == 2
    assert "Traceback (most recent call last)" in debug.err
    assert debug.err.rstrip().endswith("missing settings: set OUTBOX_BOOTSTRAP_SERVERS")


def test_an_invalid_setting_names_the_variable_and_the_value(cli: Cli) -> None:
    result = cli("status", env={"OUTBOX_BOOTSTRAP_SERVERS": "k:9092", "OUTBOX_PARTITIONS": "six"})
    assert result.code == 2
    assert result.err == "kafka-outbox: error: OUTBOX_PARTITIONS='six' is not a valid int\n"


def test_the_console_script_is_installed_and_returns_the_exit_code() -> None:
    script = shutil.which("kafka-outbox", path=str(Path(sys.executable).parent))
    assert script is not None, "kafka-outbox is not installed; run `make venv`"
    done = subprocess.run(
        [script, "inspect", "not-a-transaction"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert done.stderr.startswith("kafka-outbox: error: transaction id 'not-a-transaction'")
    module = subprocess.run(
        [sys.executable, "-m", "outbox_cli", "--help"], capture_output=True, text=True, check=False
    )
    assert module.returncode == 0 and "exit codes:" in module.stdout


def test_version_prints_the_installed_version(cli: Cli) -> None:
    from importlib.metadata import version

    result = cli("--version")
    assert result.code == 0
    assert result.out.strip() == f"kafka-outbox {version('kafka-outbox')}"


def test_migrations_are_reachable_right_after_import_outbox() -> None:
    """The README's `outbox.migrations.upgrade(url)` after `import outbox` (an AttributeError
    before), without importing Alembic for a producer that never migrates from code."""
    code = (
        "import sys, outbox; assert 'alembic' not in sys.modules; "
        "assert callable(outbox.migrations.upgrade); print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "ok", done.stderr
