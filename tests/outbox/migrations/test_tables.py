"""outbox.migrations names its tables right, keeps autogenerate off them, and imports cheaply."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from outbox import migrations
from outbox.evidence import metadata as evidence_metadata
from outbox.migrations.history import REVISION_PREFIX


@pytest.fixture
def migrated(tmp_path: Path) -> Iterator[sa.Engine]:
    """A SQLite database with the outbox's tables and two of an application's."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    migrations.upgrade(url)
    engine = sa.create_engine(url)
    app_metadata().create_all(engine)
    yield engine
    engine.dispose()


def app_metadata() -> sa.MetaData:
    metadata = sa.MetaData()
    sa.Table("customers", metadata, sa.Column("id", sa.Integer, primary_key=True))
    # An application's own table with an outbox-like name stays the application's.
    sa.Table("outbox_messages", metadata, sa.Column("id", sa.Integer, primary_key=True))
    return metadata


def proposed(engine: sa.Engine, metadata: sa.MetaData, **opts: object) -> list[tuple[str, str]]:
    """What autogenerate would do to make the database match ``metadata``: (operation, table)."""
    with engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts=opts), metadata)
    return sorted(_operation_and_table(diff) for diff in diffs)


def _operation_and_table(diff: Any) -> tuple[str, str]:
    if isinstance(diff, list):  # a column's modifications come grouped
        diff = diff[0]
    for part in diff[1:]:
        if isinstance(part, sa.Table):
            return diff[0], part.name
        if isinstance(getattr(part, "table", None), sa.Table):
            return diff[0], part.table.name
    return diff[0], str(diff[2])  # ("modify_nullable", schema, table, column, ...) and the like


def test_tables_are_the_ones_the_migrations_create(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    migrations.upgrade(url)
    engine = sa.create_engine(url)
    try:
        created = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert created == set(migrations.TABLES) | {migrations.VERSION_TABLE}
    assert created == migrations.OWNED_TABLES
    assert set(evidence_metadata.tables) == set(migrations.TABLES)


def test_every_outbox_revision_has_the_prefix_and_checks_for_one_history() -> None:
    config = Config()
    config.set_main_option("script_location", str(migrations.SCRIPT_DIR))
    revisions = list(ScriptDirectory.from_config(config).walk_revisions())
    assert len(revisions) >= 2
    for script in revisions:
        assert script.revision.startswith(REVISION_PREFIX), script.revision
        source = Path(script.path).read_text()
        upgrade = source.split("def upgrade() -> None:\n", 1)[1]
        assert upgrade.lstrip().startswith("ensure_one_history(op.get_context())"), script.path


def test_without_the_filter_autogenerate_proposes_dropping_the_outbox_tables(
    migrated: sa.Engine,
) -> None:
    """The reported problem, kept as a test: if this stopped failing, the filter would prove
    nothing."""
    found = proposed(migrated, app_metadata())
    assert ("remove_table", "outbox_evidence") in found
    assert ("remove_table", "outbox_evidence_horizon") in found
    assert ("remove_table", migrations.VERSION_TABLE) in found


def test_include_object_leaves_the_outbox_tables_out_of_autogenerate(migrated: sa.Engine) -> None:
    include = {"include_object": migrations.include_object}
    assert proposed(migrated, app_metadata(), **include) == []

    # The application's own changes are still found, its outbox-like table too.
    changed = app_metadata()
    changed.remove(changed.tables["outbox_messages"])
    sa.Table("invoices", changed, sa.Column("id", sa.Integer, primary_key=True))
    assert proposed(migrated, changed, **include) == [
        ("add_table", "invoices"),
        ("remove_table", "outbox_messages"),
    ]

    # An application that maps the outbox's tables is not told to create or change them.
    mapping = app_metadata()
    for table in evidence_metadata.tables.values():
        table.to_metadata(mapping)
    sa.Table("outbox_alembic_version", mapping, sa.Column("version_num", sa.Integer))
    assert proposed(migrated, mapping, **include) == []


def test_importing_outbox_migrations_does_not_import_alembic() -> None:
    """An application's code may import TABLES or include_object outside Alembic's env.py."""
    code = (
        "import sys, outbox.migrations as m; assert 'alembic' not in sys.modules, 'alembic'; "
        "assert callable(m.include_object) and m.TABLES; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "ok", done.stderr
