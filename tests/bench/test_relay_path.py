"""The relay scenario runs the implementations ``--impls`` names, and only those."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import relay_path
from bench.config import BenchConfig
from bench.procs import Context


class NoServices:
    """Services no implementation left out may touch: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"services.{name} used for an implementation not asked for")


def test_implementations_not_asked_for_are_not_run(tmp_path: Path) -> None:
    config = BenchConfig(impls=("baseline_a",), databases=("postgresql", "sqlite"))
    result = relay_path.run(NoServices(), config, Context(tmp_path))  # type: ignore[arg-type]
    assert result.rows == []
