"""One database, one way: an outbox revision refuses to run in one version table while the other
records the outbox's revisions (MigrationHistoryError, nothing migrated), and the switches
docs/alembic.md describes work as written."""

from __future__ import annotations

import pytest
from alembic import command

from outbox import MigrationHistoryError, migrations
from tests.outbox.migrations.shop_app import ORDERS_REV, ShopApp


def separately(shop: ShopApp, outbox_revision: str = "heads") -> None:
    """Way A: the shop's history, then the outbox's in its own version table."""
    command.upgrade(shop.config(shared=False), "head")
    migrations.upgrade(shop.url, outbox_revision)


def test_a_separately_migrated_database_refuses_the_shared_history_until_stamped(
    shop: ShopApp,
) -> None:
    separately(shop)
    before = (shop.tables(), shop.recorded("alembic_version"))
    shop.label_branch()
    shared = shop.config(shared=True)

    # Before: "table outbox_evidence already exists" from the second run of outbox_0001.
    with pytest.raises(MigrationHistoryError) as refused:
        command.upgrade(shared, "heads")
    message = str(refused.value)
    assert f"{migrations.VERSION_TABLE!r} records the outbox's revisions (outbox_0002)" in message
    assert "run `alembic stamp outbox_0002`, then DROP TABLE outbox_alembic_version" in message
    assert "remove outbox.migrations:versions from version_locations" in message
    assert (shop.tables(), shop.recorded("alembic_version")) == before

    # docs/alembic.md, "From A to B".
    command.stamp(shared, "outbox_0002")
    shop.execute(f"DROP TABLE {migrations.VERSION_TABLE}")
    command.upgrade(shared, "heads")
    assert shop.recorded("alembic_version") == {ORDERS_REV, "outbox_0002"}
    command.check(shared)


def test_a_version_table_left_behind_stops_the_next_outbox_revision(shop: ShopApp) -> None:
    """Stamped into the shop's history but the old table not dropped: the next outbox revision
    (here outbox_0002) would run while outbox_alembic_version still says it is due there."""
    separately(shop, "outbox_0001")
    shared = shop.config(shared=True)
    command.stamp(shared, "outbox_0001")

    with pytest.raises(MigrationHistoryError) as refused:
        command.upgrade(shared, "heads")
    message = str(refused.value)
    assert "drop the table left from before the switch: DROP TABLE outbox_alembic_version" in (
        message
    )
    assert "alembic stamp" not in message
    assert "outbox_evidence_horizon" not in shop.tables()

    shop.execute(f"DROP TABLE {migrations.VERSION_TABLE}")
    command.upgrade(shared, "heads")
    assert "outbox_evidence_horizon" in shop.tables()
    assert shop.recorded("alembic_version") == {ORDERS_REV, "outbox_0002"}


def test_a_database_in_the_shared_history_refuses_outbox_migrations_upgrade(
    shop: ShopApp,
) -> None:
    shop.label_branch()
    shared = shop.config(shared=True)
    command.upgrade(shared, "heads")

    # Before: "table outbox_evidence already exists" (kafka-outbox migrate's way, too).
    with pytest.raises(MigrationHistoryError) as refused:
        migrations.upgrade(shop.url)
    message = str(refused.value)
    assert "'alembic_version' records the outbox's revisions (outbox_0002)" in message
    assert "Run `alembic upgrade heads` with the application's config instead" in message
    assert shop.recorded(migrations.VERSION_TABLE) == set()

    # docs/alembic.md, "From B to A".
    command.stamp(shared, "outbox@base")
    assert shop.recorded("alembic_version") == {ORDERS_REV}
    migrations.stamp(shop.url, "outbox_0002")
    separate = shop.config(shared=False)
    command.upgrade(separate, "head")
    migrations.upgrade(shop.url)
    assert shop.recorded(migrations.VERSION_TABLE) == {"outbox_0002"}
    assert shop.tables() >= migrations.TABLES
    command.check(separate)
