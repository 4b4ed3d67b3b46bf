"""Alembic migrations for the tables the outbox needs in the producer's own database.

They form an Alembic branch labelled ``outbox`` with its own base. An application with an Alembic
history of its own uses them in one of two ways (docs/alembic.md):

* separately (the default): keep calling :func:`upgrade` (or ``kafka-outbox migrate``), which
  records the outbox's revisions in its own version table, :data:`VERSION_TABLE`;
* in the application's history: add ``outbox.migrations:versions`` (:data:`VERSIONS_DIR`) to its
  ``version_locations`` and run ``alembic upgrade heads`` - the outbox's revisions are then
  recorded in the application's ``alembic_version``, and the history has two heads.

Either way the application's ``env.py`` passes :func:`include_object` to ``context.configure``,
or its autogenerate proposes dropping the outbox's tables. A database uses one way only: an
outbox revision about to run in one version table while the other records the outbox's
revisions raises :class:`~outbox.errors.MigrationHistoryError`.

Importing this module does not import Alembic (an application's code may want
:data:`TABLES` or :func:`include_object` without it); the functions that run Alembic do.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from outbox.errors import MigrationHistoryError
from outbox.migrations.tables import OWNED_TABLES, TABLES, VERSION_TABLE, include_object

if TYPE_CHECKING:
    from alembic.config import Config

SCRIPT_DIR = Path(__file__).resolve().parent
#: The outbox's revisions; ``outbox.migrations:versions`` names the same directory in an
#: ``alembic.ini`` or ``pyproject.toml`` (Alembic reads ``package:path`` as a package resource).
VERSIONS_DIR = SCRIPT_DIR / "versions"
BRANCH = "outbox"

__all__ = [
    "BRANCH",
    "OWNED_TABLES",
    "SCRIPT_DIR",
    "TABLES",
    "VERSIONS_DIR",
    "VERSION_TABLE",
    "MigrationHistoryError",
    "alembic_config",
    "downgrade",
    "include_object",
    "stamp",
    "upgrade",
]


def alembic_config(url: str) -> Config:
    """An Alembic config for our migrations on their own against ``url`` (an SQLAlchemy URL),
    recording them in :data:`VERSION_TABLE`."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(SCRIPT_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.set_main_option("version_table", VERSION_TABLE)
    return config


def upgrade(url: str, revision: str = "heads") -> None:
    """Create or update the outbox tables in the database at ``url``."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Remove the outbox tables (to ``revision``) from the database at ``url``."""
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def stamp(url: str, revision: str) -> None:
    """Record ``revision`` in :data:`VERSION_TABLE` without running anything.

    For a database whose outbox tables were migrated in the application's history and now move
    to their own (docs/alembic.md, "Switching from one way to the other"): the tables exist, and
    :func:`upgrade` must start from the revision they are at.
    """
    from alembic import command

    command.stamp(alembic_config(url), revision)
