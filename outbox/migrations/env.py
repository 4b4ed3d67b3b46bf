"""Alembic environment for running the outbox migrations on their own."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

config = context.config
url = config.get_main_option("sqlalchemy.url")
version_table = config.get_main_option("version_table") or "outbox_alembic_version"

if context.is_offline_mode():
    context.configure(url=url, version_table=version_table, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = sa.create_engine(str(url), poolclass=sa.pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, version_table=version_table)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
