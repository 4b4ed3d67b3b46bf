"""``kafka-outbox topics ensure``, ``migrate`` and ``evidence prune``: set-up and upkeep."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from outbox.errors import KafkaOperationError
from outbox.settings import variable
from outbox_cli.errors import CommandError, UnreachableError, UsageError
from outbox_cli.kafka import connection, probe
from outbox_cli.settings import operator_settings

if TYPE_CHECKING:
    import sqlalchemy as sa


def ensure_topics(replication_factor: int, timeout: float) -> int:
    """Create the missing internal topics and verify the existing ones (``OUTBOX_*`` settings)."""
    from outbox.topics import ensure_topics as ensure

    settings = operator_settings()
    probe(
        connection(settings.bootstrap_servers, settings.kafka),
        timeout,
        variable("bootstrap_servers"),
    )
    try:
        created = ensure(settings, replication_factor=replication_factor, timeout=timeout)
    except KafkaOperationError as err:
        raise CommandError(str(err)) from err
    for topic in settings.topics.all():
        print(f"{topic}: {'created' if topic in created else 'exists, settings ok'}")
    return 0


def migrate(db_url: str, revision: str, timeout: float) -> int:
    """Run the outbox's Alembic migrations (evidence/fence table) against ``db_url``."""
    from outbox import migrations

    engine, shown = _engine(db_url, timeout)
    engine.dispose()
    migrations.upgrade(db_url, revision)
    print(f"{shown}: outbox migrations applied up to {revision!r}")
    return 0


def prune(db_url: str, older_than_s: float, batch_size: int, timeout: float) -> int:
    """Delete evidence and fence rows older than the retention (:mod:`outbox.pruning`)."""
    from outbox.pruning import prune_evidence

    engine, shown = _engine(db_url, timeout)
    try:
        done = prune_evidence(
            engine, older_than=dt.timedelta(seconds=older_than_s), batch_size=batch_size
        )
    finally:
        engine.dispose()
    print(
        f"{shown}: {done.deleted} evidence rows created before "
        f"{done.pruned_before.isoformat(timespec='seconds')} deleted; checks of transactions "
        "older than that answer UNKNOWN when their row is gone"
    )
    return 0


def _engine(db_url: str, timeout: float) -> tuple[sa.Engine, str]:
    """An engine on ``db_url``, connected once; and the URL to print, password hidden.

    Raises:
        UsageError: a malformed URL, or no driver for it.
        UnreachableError: the database does not answer.
    """
    import sqlalchemy as sa
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    try:
        url = sa.engine.make_url(db_url)
    except ArgumentError as err:
        raise UsageError(
            f"--db-url {db_url!r} is not an SQLAlchemy URL; e.g. "
            "postgresql+psycopg://user:password@host:5432/db or sqlite:////data/app.db"
        ) from err
    shown = url.render_as_string(hide_password=True)
    connect_args = (
        {"connect_timeout": max(1, int(timeout))} if url.get_backend_name() == "postgresql" else {}
    )
    try:
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args=connect_args)
        with engine.connect():
            pass
    except NoSuchModuleError as err:
        raise UsageError(
            f"--db-url {shown}: no SQLAlchemy dialect or driver {url.drivername!r}; install it "
            "(PostgreSQL: pip install 'kafka-outbox[postgres]')"
        ) from err
    except ModuleNotFoundError as err:
        raise UsageError(f"--db-url {shown}: the driver is not installed ({err})") from err
    except DBAPIError as err:
        reason = str(err.orig).strip().splitlines()[0] if err.orig else str(err)
        raise UnreachableError(f"cannot connect to the database at {shown}: {reason}") from err
    return engine, shown
