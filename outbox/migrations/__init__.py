"""Alembic migrations for the tables the outbox needs in the producer's own database.

They form an Alembic branch labelled ``outbox``, so they can run on their own
(:func:`upgrade` / ``alembic -c ...``) or inside an application's Alembic history: add
:data:`VERSIONS_DIR` to the application's ``version_locations`` and run
``alembic upgrade outbox@head``.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

SCRIPT_DIR = Path(__file__).resolve().parent
VERSIONS_DIR = SCRIPT_DIR / "versions"
BRANCH = "outbox"
#: Our own version table, so our history never collides with the application's ``alembic_version``.
VERSION_TABLE = "outbox_alembic_version"


def alembic_config(url: str) -> Config:
    """An Alembic config for our migrations against ``url`` (an SQLAlchemy URL)."""
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.set_main_option("version_table", VERSION_TABLE)
    return config


def upgrade(url: str, revision: str = "heads") -> None:
    """Create or update the outbox tables in the database at ``url``."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    """Remove the outbox tables (to ``revision``) from the database at ``url``."""
    command.downgrade(alembic_config(url), revision)
