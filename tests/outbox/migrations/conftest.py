"""A fresh database per test, on SQLite and (integration) PostgreSQL, and the shop service."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.outbox.migrations.shop_app import ShopApp, documented_env_py, forget_modules


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def app_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of its own: SQLite needs no service, PostgreSQL is the session's."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shop.db'}"
        return
    server: str = request.getfixturevalue("postgres_url")
    name = f"shop_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {name}"))
        yield sa.make_url(server).set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE {name}"))
    finally:
        admin.dispose()


@pytest.fixture
def shop(tmp_path: Path, app_db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ShopApp]:
    """The shop service with docs/alembic.md's env.py, importable as ``shop``."""
    app = ShopApp(tmp_path / "app", app_db_url).write(documented_env_py())
    monkeypatch.syspath_prepend(str(app.root))
    forget_modules()
    yield app
    forget_modules()
