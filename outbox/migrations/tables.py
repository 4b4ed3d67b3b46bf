"""The outbox's own tables, and the Alembic hook that keeps an application's autogenerate off them.

An application's ``alembic revision --autogenerate`` (and ``alembic check``) compares the
application's ``MetaData`` with every table it finds in the database. The outbox's tables are in
no application's ``MetaData``, so without a filter every autogenerate proposes dropping
``outbox_evidence`` - a migration that, once applied, makes every check of a committed
transaction answer ROLLBACK. :func:`include_object` is the filter: the application passes it to
``context.configure(include_object=...)`` in its ``env.py`` (docs/alembic.md).

Tables are matched by name only (in any schema), from an explicit list rather than a prefix: an
application may well have tables of its own called ``outbox_...`` (a home-grown outbox it is
moving away from), and those must stay under its autogenerate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy.schema import SchemaItem

#: The tables the outbox's migrations create. A new migration that creates a table adds it here
#: (tests/outbox/migrations checks this list against a migrated database).
TABLES = frozenset({"outbox_evidence", "outbox_evidence_horizon"})

#: The outbox's own version table, used when its migrations run on their own
#: (``outbox.migrations.upgrade``), so its history never collides with an application's
#: ``alembic_version``.
VERSION_TABLE = "outbox_alembic_version"

#: Every table an application's autogenerate must leave alone.
OWNED_TABLES = TABLES | {VERSION_TABLE}


def is_outbox_table(name: str | None) -> bool:
    """Whether ``name`` (unqualified, as Alembic and SQLAlchemy give it) is one of the outbox's
    tables or its version table."""
    return name in OWNED_TABLES


def include_object(
    object_: SchemaItem,
    name: str | None,
    type_: str,
    reflected: bool,
    compare_to: SchemaItem | None,
) -> bool:
    """Alembic's ``include_object`` hook: ``False`` for the outbox's tables and anything on them.

    Pass it to ``context.configure(include_object=outbox.migrations.include_object)`` in the
    application's ``env.py``; with a filter of its own, combine the two
    (``outbox.migrations.include_object(...) and mine(...)``). It answers for both sides of
    the comparison, so autogenerate proposes neither dropping the outbox's tables (they are in
    the database, not in the application's ``MetaData``) nor creating them (should the
    application map one of them, say to show evidence rows). Everything else is the
    application's: ``True``.
    """
    if type_ == "table":
        return not is_outbox_table(name)
    # Columns, indexes and constraints: Alembic does not ask about those of a skipped table
    # (Alembic 1.13-1.20); answering for them too keeps the hook right should a version ask.
    table = getattr(object_, "table", None)
    return not is_outbox_table(getattr(table, "name", None))


if TYPE_CHECKING:
    from alembic.runtime.environment import IncludeObjectFn

    #: mypy checks here that the hook fits ``context.configure(include_object=...)``.
    _FITS_ALEMBIC: IncludeObjectFn = include_object
