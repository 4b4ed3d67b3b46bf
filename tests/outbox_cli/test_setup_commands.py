"""``kafka-outbox topics ensure`` and ``kafka-outbox migrate`` on a real broker and databases."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from outbox import migrations
from outbox.protocol import TopicNames
from tests.kafka_helpers import create_topic, unique
from tests.outbox_cli.conftest import Cli

pytestmark = pytest.mark.integration


def test_topics_ensure_creates_the_four_topics_once_then_verifies_them(
    cli: Cli, kafka_bootstrap: str
) -> None:
    names = TopicNames(unique("__outbox-cli"))
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_TOPIC_PREFIX": names.prefix,
        "OUTBOX_PARTITIONS": "2",
    }
    first = cli("topics", "ensure", env=env)
    assert first.code == 0, first.err
    assert first.out.splitlines() == [f"{t}: created" for t in names.all()]
    again = cli("topics", "ensure", env=env)
    assert again.code == 0, again.err
    assert again.out.splitlines() == [f"{t}: exists, settings ok" for t in names.all()]
    # A different partition count cannot be used with the existing topics: a problem, exit 1
    mismatch = cli("topics", "ensure", env={**env, "OUTBOX_PARTITIONS": "3"})
    assert mismatch.code == 1
    assert f"{names.half} has 2 partitions, expected 3" in mismatch.err


def test_topics_ensure_refuses_a_dead_letter_topic_with_fewer_partitions(
    cli: Cli, kafka_bootstrap: str
) -> None:
    """Before, it said "exists, settings ok": the first give-up on a half partition the topic
    lacked failed every round of that checker, COMMITs of lost-op transactions included."""
    names = TopicNames(unique("__outbox-cli-dl"))
    create_topic(kafka_bootstrap, names.dead_letter, partitions=1)
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_TOPIC_PREFIX": names.prefix,
        "OUTBOX_PARTITIONS": "3",
    }
    refused = cli("topics", "ensure", env=env)
    assert refused.code == 1
    assert f"{names.dead_letter} has 1 partitions, expected at least 3" in refused.err


def test_topics_ensure_refuses_an_op_topic_that_is_not_compacted(
    cli: Cli, kafka_bootstrap: str
) -> None:
    # Given an op topic someone created by hand with the broker's default policy (delete), on
    # which retention would drop decisions the relay and checker rebuild from
    names = TopicNames(unique("__outbox-cli-policy"))
    create_topic(kafka_bootstrap, names.op, partitions=2, config={"cleanup.policy": "delete"})
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_TOPIC_PREFIX": names.prefix,
        "OUTBOX_PARTITIONS": "2",
    }
    # Then ensure says so and exits 1, naming the topic, both policies and the fix
    refused = cli("topics", "ensure", env=env)
    assert refused.code == 1
    assert f"{names.op} has cleanup.policy=delete, expected compact,delete" in refused.err
    assert (
        f"fix: kafka-configs.sh --bootstrap-server {kafka_bootstrap} --alter --entity-type topics "
        f"--entity-name {names.op} --add-config "
        "'cleanup.policy=[compact,delete],retention.ms=1209600000'"
    ) in refused.err


def test_topics_ensure_exits_3_when_the_broker_is_unreachable(cli: Cli, unused_port: int) -> None:
    env = {"OUTBOX_BOOTSTRAP_SERVERS": f"127.0.0.1:{unused_port}"}
    unreachable = cli("--timeout", "2s", "topics", "ensure", env=env)
    assert unreachable.code == 3
    assert "cannot reach Kafka" in unreachable.err and "OUTBOX_BOOTSTRAP_SERVERS" in unreachable.err


def test_migrate_creates_the_evidence_table_and_is_idempotent(cli: Cli, db_url: str) -> None:
    first = cli("migrate", "--db-url", db_url)
    assert first.code == 0, first.err
    assert "outbox migrations applied" in first.out
    assert "outbox_evidence" in sa.inspect(sa.create_engine(db_url)).get_table_names()
    assert cli("migrate", "--db-url", db_url).code == 0


def test_migrate_refuses_a_database_that_runs_the_outbox_revisions_in_the_apps_history(
    cli: Cli, tmp_path: Path
) -> None:
    """docs/alembic.md way B records the outbox's revisions in the application's
    alembic_version; migrate would run them a second time (before: an unexpected
    OperationalError, "table outbox_evidence already exists")."""
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    in_app_history = migrations.alembic_config(url)
    in_app_history.set_main_option("version_table", "alembic_version")
    command.upgrade(in_app_history, "heads")

    refused = cli("migrate", "--db-url", url)
    assert refused.code == 1
    assert "'alembic_version' records the outbox's revisions (outbox_0002)" in refused.err
    assert "Run `alembic upgrade heads` with the application's config instead" in refused.err


def test_migrate_hides_the_password_when_it_prints_the_url(cli: Cli, postgres_url: str) -> None:
    url = sa.engine.make_url(postgres_url).set(password="s3cret")
    result = cli("migrate", "--db-url", url.render_as_string(hide_password=False))
    assert "s3cret" not in result.out + result.err


def test_migrate_with_a_wrong_db_url_exits_3_and_a_malformed_one_2(
    cli: Cli, postgres_url: str, unused_port: int, tmp_path: Path
) -> None:
    no_database = sa.engine.make_url(postgres_url).set(database="no_such_db")
    missing_db = cli("migrate", "--db-url", no_database.render_as_string(hide_password=False))
    assert missing_db.code == 3
    assert 'database "no_such_db" does not exist' in missing_db.err
    closed = f"postgresql+psycopg://u:p@127.0.0.1:{unused_port}/db"
    refused = cli("--timeout", "2s", "migrate", "--db-url", closed)
    assert refused.code == 3
    assert refused.err.startswith("kafka-outbox: error: cannot connect to the database at")
    assert "u:***@" in refused.err
    no_dir = cli("migrate", "--db-url", f"sqlite:///{tmp_path}/absent/dir/x.db")
    assert no_dir.code == 3
    malformed = cli("migrate", "--db-url", "localhost:5432/orders")
    assert malformed.code == 2 and "is not an SQLAlchemy URL" in malformed.err
    no_driver = cli("migrate", "--db-url", "oracle+nodriver://x/y")
    assert no_driver.code == 2 and "no SQLAlchemy dialect or driver" in no_driver.err
