"""Kafka, PostgreSQL and SQLite for a benchmark run, started the way the tests start them.

By default the broker and the database run as local processes (``outbox.testing``'s local
provider): no container layer between them and the benchmark. ``OUTBOX_BENCH_PROVIDER``
(``local``, ``containers`` or ``auto``) chooses another provider, and the test harness's
``OUTBOX_TEST_KAFKA_BOOTSTRAP`` / ``OUTBOX_TEST_POSTGRES_URL`` point at services already running.
Every scenario gets a fresh PostgreSQL database or SQLite file, so none sees another's rows.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from outbox.testing import HarnessSettings, RunningService, start_kafka, start_postgres
from outbox.testing.providers import Provider

ENV_PROVIDER = "OUTBOX_BENCH_PROVIDER"
DATABASES = ("postgresql", "sqlite")


@dataclass
class Services:
    """The running services of one benchmark run; ``close()`` stops what it started."""

    kafka: RunningService
    postgres: RunningService | None
    harness: HarnessSettings
    sqlite_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bench-sqlite-")))

    @property
    def bootstrap(self) -> str:
        return self.kafka.address

    def database(self, kind: str, name: str) -> str:
        """A fresh, empty database of ``kind`` ("postgresql" or "sqlite"); its SQLAlchemy URL."""
        tag = f"{name}_{uuid.uuid4().hex[:6]}".replace("-", "_")
        if kind == "sqlite":
            return f"sqlite:///{self.sqlite_dir / (tag + '.db')}"
        if kind != "postgresql" or self.postgres is None:
            raise ValueError(f"no {kind} database in this run")
        admin = sa.create_engine(self.postgres.address, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {tag}"))
        admin.dispose()
        url = sa.make_url(self.postgres.address).set(database=tag)
        return url.render_as_string(hide_password=False)

    def describe(self) -> dict[str, Any]:
        """Which provider runs what, and the versions and settings that shape the figures."""
        info: dict[str, Any] = {
            "kafka": {
                "provider": self.kafka.provider,
                "address": self.kafka.address,
                "version": _kafka_version(self.harness),
            },
            "sqlite": {
                "version": sqlite3.sqlite_version,
                "settings": "journal_mode=WAL, synchronous=NORMAL, busy timeout 30 s",
            },
        }
        if self.postgres is not None:
            info["postgresql"] = {
                "provider": self.postgres.provider,
                "address": self.postgres.address,
                **_postgres_settings(self.postgres.address),
            }
        return info

    def close(self) -> None:
        if self.postgres is not None:
            self.postgres.stop()
        self.kafka.stop()
        shutil.rmtree(self.sqlite_dir, ignore_errors=True)


def start_services(*, postgres: bool = True) -> Services:
    """Start (or find) the broker and, when asked, PostgreSQL.

    Raises:
        ServiceStartError: a service could not start; the message says why and how to fix it.
    """
    harness = HarnessSettings.from_env()
    provider: Provider = os.environ.get(ENV_PROVIDER, "local").strip().lower() or "local"  # type: ignore[assignment]
    kafka = (
        start_kafka(harness) if harness.kafka_bootstrap else start_kafka(harness, provider=provider)
    )
    try:
        pg: RunningService | None = None
        if postgres:
            pg = (
                start_postgres(harness)
                if harness.postgres_url
                else start_postgres(harness, provider=provider)
            )
    except BaseException:
        kafka.stop()
        raise
    return Services(kafka=kafka, postgres=pg, harness=harness)


def engine_for(url: str, *, pool_size: int = 5) -> sa.Engine:
    """An engine as a service would configure it: a pool sized to its threads.

    SQLite: WAL journal (readers do not block the writer), ``synchronous=NORMAL``, and a 30 s
    busy timeout, so threads queue for the write lock instead of failing.
    """
    if url.startswith("sqlite"):
        engine = sa.create_engine(
            url, connect_args={"timeout": 30}, pool_size=pool_size, max_overflow=4
        )
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return sa.create_engine(url, pool_size=pool_size, max_overflow=4)


def async_engine_for(url: str, *, pool_size: int = 5) -> Any:
    """:func:`engine_for` through an asyncio driver (psycopg's async mode, aiosqlite), with the
    same SQLite settings."""
    from sqlalchemy.ext.asyncio import create_async_engine

    if url.startswith("sqlite"):
        engine = create_async_engine(
            url.replace("sqlite:///", "sqlite+aiosqlite:///", 1),
            connect_args={"timeout": 30},
            pool_size=pool_size,
            max_overflow=4,
        )

        sa.event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(url, pool_size=pool_size, max_overflow=4)


def _sqlite_pragmas(dbapi_connection: Any, record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def db_kind(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def _kafka_version(harness: HarnessSettings) -> str | None:
    try:
        return harness.kafka_version()
    except Exception:  # an external broker: no jars here to read the version from
        return None


def _postgres_settings(url: str) -> dict[str, Any]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            version = conn.execute(sa.text("SHOW server_version")).scalar()
            settings = {
                name: conn.execute(sa.text(f"SHOW {name}")).scalar()
                for name in (
                    "fsync",
                    "synchronous_commit",
                    "full_page_writes",
                    "max_connections",
                    "wal_level",
                )
            }
    finally:
        engine.dispose()
    return {"version": version, "settings": settings}
