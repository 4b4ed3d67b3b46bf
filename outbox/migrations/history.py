"""One version table per database for the outbox's revisions.

The outbox's migrations run in one of two ways (docs/alembic.md): on their own, by
``outbox.migrations.upgrade()`` or ``kafka-outbox migrate``, which record them in
``outbox_alembic_version``; or inside the application's history (``outbox.migrations:versions``
in its ``version_locations``, ``alembic upgrade heads``), which records them in the application's
version table, ``alembic_version``. Each table knows nothing of the other, so a database migrated
one way and then the other would run ``outbox_0001`` a second time and fail on "table
outbox_evidence already exists" - or worse, once a later revision alters a table, run it twice.

Every outbox revision therefore calls :func:`ensure_one_history` first. It looks at the version
table *not* in use and refuses, naming the way out, when that table records outbox revisions.
An application whose version table is not called ``alembic_version`` is not seen from the
``upgrade()`` side; its second run then fails on the existing table instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

from outbox.errors import MigrationHistoryError
from outbox.migrations.tables import VERSION_TABLE

if TYPE_CHECKING:
    from alembic.runtime.migration import MigrationContext

#: Alembic's default version table: where an application's history records its revisions.
APP_VERSION_TABLE = "alembic_version"
#: Every outbox revision id starts with it (tests/outbox/migrations checks), so the outbox's rows
#: can be told from an application's in a shared version table.
REVISION_PREFIX = "outbox_"
DOCS = "docs/alembic.md"


def ensure_one_history(context: MigrationContext) -> None:
    """Raise :class:`MigrationHistoryError` if the outbox's revisions are recorded in a version
    table other than the one this migration run writes to.

    Called at the top of every outbox revision's ``upgrade()``; offline (``--sql``) there is no
    database to look at, and it does nothing.
    """
    connection = context.connection
    if context.as_sql or connection is None:
        return
    if context.version_table == VERSION_TABLE:
        elsewhere = _outbox_rows(connection, APP_VERSION_TABLE)
        if elsewhere:
            raise MigrationHistoryError(_in_app_history(elsewhere))
        return
    elsewhere = _outbox_rows(connection, VERSION_TABLE)
    if elsewhere:
        here = [rev for rev in context.get_current_heads() if rev.startswith(REVISION_PREFIX)]
        raise MigrationHistoryError(_in_own_table(context.version_table, elsewhere, here))


def _outbox_rows(connection: sa.Connection, table: str) -> list[str]:
    """The outbox revisions recorded in ``table`` (none if it does not exist)."""
    if not sa.inspect(connection).has_table(table):
        return []
    version_num = sa.column("version_num", sa.String)
    query = sa.select(version_num).select_from(sa.table(table)).order_by(version_num)
    rows = connection.execute(query).scalars()
    return [rev for rev in rows if rev.startswith(REVISION_PREFIX)]


def _in_app_history(recorded: list[str]) -> str:
    revisions = ", ".join(recorded)
    return (
        f"{APP_VERSION_TABLE!r} records the outbox's revisions ({revisions}): this database "
        "runs them in the application's Alembic history (outbox.migrations:versions in its "
        "version_locations), so outbox.migrations.upgrade() and `kafka-outbox migrate` must "
        f"not run them a second time into {VERSION_TABLE!r}. Run `alembic upgrade heads` with "
        "the application's config instead, or, to keep the outbox's history separate from now "
        f"on, follow 'Switching from one way to the other' in {DOCS}"
    )


def _in_own_table(version_table: str, recorded: list[str], here: list[str]) -> str:
    revisions = " ".join(recorded)
    if here:  # stamped into the application's history already; the old table was left behind
        fix = f"drop the table left from before the switch: DROP TABLE {VERSION_TABLE}"
    else:
        fix = f"run `alembic stamp {revisions}`, then DROP TABLE {VERSION_TABLE}"
    return (
        f"{VERSION_TABLE!r} records the outbox's revisions ({revisions}): this database's "
        "outbox tables were migrated by outbox.migrations.upgrade() or `kafka-outbox migrate`, "
        f"not in {version_table!r}, so running the outbox's revisions here would create them a "
        f"second time. To move them into the application's history, {fix} ({DOCS}, 'Switching "
        "from one way to the other'); to keep them separate, remove outbox.migrations:versions "
        "from version_locations and keep calling outbox.migrations.upgrade()"
    )
