"""Way B of docs/alembic.md: the outbox's revisions in the application's version_locations, one
version table, two heads."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.script import Script
from alembic.util import CommandError

from outbox import migrations
from tests.outbox.migrations.shop_app import APP_TABLES, ORDERS_REV, ShopApp


def test_one_history_has_two_heads_and_upgrade_heads_creates_both_sets_of_tables(
    shop: ShopApp,
) -> None:
    config = shop.config(shared=True)
    command.heads(config)
    assert sorted(shop.output.getvalue().splitlines()) == [
        f"{ORDERS_REV} (head)",
        "outbox_0002 (outbox) (head)",
    ]
    with pytest.raises(CommandError, match="Multiple head revisions are present"):
        command.upgrade(config, "head")

    command.upgrade(config, "heads")
    assert shop.tables() == APP_TABLES | migrations.TABLES | {"alembic_version"}
    assert shop.recorded("alembic_version") == {ORDERS_REV, "outbox_0002"}
    command.upgrade(config, "heads")  # again: nothing to do


def test_one_history_makes_new_revisions_on_the_labelled_branch(shop: ShopApp) -> None:
    shop.label_branch()
    config = shop.config(shared=True)
    command.upgrade(config, "heads")
    shop.add_invoice_model()

    with pytest.raises(CommandError, match="Multiple heads are present"):
        command.revision(config, message="add invoices", autogenerate=True)
    script = command.revision(config, message="add invoices", autogenerate=True, head="shop@head")
    assert isinstance(script, Script)
    assert Path(script.path).parent == shop.versions
    assert script.down_revision == ORDERS_REV
    text = Path(script.path).read_text()
    assert "op.create_table('invoices'" in text
    assert "outbox" not in text

    command.upgrade(config, "heads")
    assert shop.recorded("alembic_version") == {script.revision, "outbox_0002"}
    command.check(config)
    command.downgrade(config, "shop@-1")
    assert "invoices" not in shop.tables()
    assert shop.tables() >= migrations.TABLES


def test_one_history_upgrade_heads_offline_writes_both_histories_sql(shop: ShopApp) -> None:
    """--sql has no database to check the version tables in; the check stays out of the way."""
    command.upgrade(shop.config(shared=True), "heads", sql=True)
    sql = shop.output.getvalue()
    for table in ("customers", "orders", "outbox_evidence", "outbox_evidence_horizon"):
        assert f"CREATE TABLE {table} " in sql
    assert "INSERT INTO alembic_version (version_num) VALUES ('outbox_0001')" in sql
    assert migrations.VERSION_TABLE not in sql
