"""docs/alembic.md's config snippets find the outbox's revisions, and it names every export of
outbox.migrations. Its env.py is the one tests/outbox/migrations runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from outbox import migrations
from tests.outbox.migrations.shop_app import DOC, doc_block


def heads(config: Config) -> list[str]:
    return sorted(ScriptDirectory.from_config(config).get_heads())


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A service directory with an empty history of its own (``migrations/versions``)."""
    (tmp_path / "migrations" / "versions").mkdir(parents=True)
    return tmp_path


def test_the_documented_alembic_ini_finds_the_outbox_revisions(project: Path) -> None:
    ini = project / "alembic.ini"
    ini.write_text(doc_block("ini", "outbox.migrations:versions"))
    assert heads(Config(ini)) == ["outbox_0002"]


def test_the_documented_pyproject_finds_the_outbox_revisions(project: Path) -> None:
    toml = project / "pyproject.toml"
    toml.write_text(doc_block("toml", "outbox.migrations:versions"))
    assert heads(Config(toml_file=toml)) == ["outbox_0002"]


@pytest.mark.parametrize("name", migrations.__all__)
def test_every_export_of_outbox_migrations_is_documented(name: str) -> None:
    assert f"`{name}" in DOC.read_text()
