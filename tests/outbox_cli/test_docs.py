"""docs/cli.md names every setting variable, and every name it gives is a real one."""

from __future__ import annotations

import re
from pathlib import Path

from outbox_cli.errors import EXIT_CODES
from outbox_cli.main import build_parser
from outbox_cli.settings import is_setting, known_variables

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
NAMES = set(re.findall(r"`(OUTBOX_[A-Z0-9_]+)(?:\*)?`", DOC))


def test_every_setting_variable_is_in_the_cli_doc() -> None:
    names, prefixes = known_variables()
    assert sorted(names - NAMES) == []
    assert sorted(p for p in prefixes if f"`{p}*`" not in DOC) == []


def test_every_variable_the_cli_doc_names_is_a_setting() -> None:
    assert (
        sorted(n for n in NAMES if not n.endswith("_") and not is_setting(n)) == []
    )  # _* prefixes


def test_the_doc_lists_every_command_and_exit_code() -> None:
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for command in commands:
        assert f"| `{command}" in DOC, command
    for code, _ in EXIT_CODES:
        assert f"\n| {code} | " in DOC


def test_the_metrics_the_readme_tells_to_alert_on_exist() -> None:
    from dataclasses import fields

    from checker.plan import CheckerStats

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    relay_source = (root / "relay" / "metrics.py").read_text()
    checker_source = (root / "checker" / "metrics.py").read_text()
    checker_names = {f"outbox_checker_{f.name}" for f in fields(CheckerStats)}
    for name in set(re.findall(r"\boutbox_relay_[a-z_]+", readme)):
        assert f'"{name}' in relay_source, name
    for name in set(re.findall(r"\boutbox_checker_[a-z_]+", readme)):
        base = name.removesuffix("_total")
        assert base in checker_names or f'"{base}"' in checker_source, name
