"""Way A of docs/alembic.md: the application's history and the outbox's, each in its own version
table, side by side in one database."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.script import Script

from outbox import migrations
from tests.outbox.migrations.shop_app import APP_TABLES, ORDERS_REV, ShopApp


def test_separate_histories_keep_one_head_and_both_sets_of_tables(shop: ShopApp) -> None:
    config = shop.config(shared=False)
    command.upgrade(config, "head")
    migrations.upgrade(shop.url)

    assert shop.tables() == APP_TABLES | migrations.OWNED_TABLES | {"alembic_version"}
    assert shop.recorded("alembic_version") == {ORDERS_REV}
    assert shop.recorded(migrations.VERSION_TABLE) == {"outbox_0002"}
    command.heads(config)
    assert shop.output.getvalue().splitlines() == [f"{ORDERS_REV} (head)"]
    command.upgrade(config, "head")  # again: nothing to do, no second head
    migrations.upgrade(shop.url)


def test_separate_histories_autogenerate_the_apps_change_and_nothing_else(shop: ShopApp) -> None:
    config = shop.config(shared=False)
    command.upgrade(config, "head")
    migrations.upgrade(shop.url)
    shop.add_invoice_model()

    script = command.revision(config, message="add invoices", autogenerate=True)
    assert isinstance(script, Script)
    text = Path(script.path).read_text()
    assert "op.create_table('invoices'" in text
    assert "outbox" not in text
    assert script.down_revision == ORDERS_REV

    command.upgrade(config, "head")
    assert "invoices" in shop.tables()
    command.check(config)
    assert shop.recorded(migrations.VERSION_TABLE) == {"outbox_0002"}
