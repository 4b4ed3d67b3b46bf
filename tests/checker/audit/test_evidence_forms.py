"""The evidence findings and what has no row by design: listener transactions, pruned rows.

Transactions of ``TransactionalProducer`` (half records with ``outbox-check-by: listener``)
never write an evidence row, and ``outbox.prune_evidence`` deletes old rows after recording its
horizon: neither is a COMMIT without evidence. A database migrated only to ``outbox_0001`` has
no horizon table and still audits. Each on PostgreSQL (over JDBC) and SQLite (on the driver).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from checker.audit.evidence_source import horizon_table_for, read_horizon
from checker.audit.findings import FINDINGS
from checker.audit.job import run_audit
from checker.audit.settings import AuditSettings
from outbox import (
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
    migrations,
)
from outbox.evidence import evidence_table, horizon_table
from outbox.protocol.half import HalfMessage
from outbox.protocol.states import OpState
from outbox.pruning import DEFAULT_RETENTION, PRUNE_MARGIN_MS, prune_evidence
from outbox.testing.stream import StreamTxn, StreamWriter
from tests.checker.audit.scenario import txn_id_at
from tests.checker.audit.seeded import fresh_database
from tests.kafka_helpers import create_topic, unique

DAY_MS = 86_400_000
#: (database, migrated to): a database of the first migration has no horizon table.
DATABASES = [
    ("postgresql", "heads"),
    ("sqlite", "heads"),
    ("postgresql", "outbox_0001"),
    ("sqlite", "outbox_0001"),
]


def test_the_horizon_table_is_the_migrations_next_to_the_evidence_table() -> None:
    assert horizon_table_for("outbox_evidence") == horizon_table.name
    assert horizon_table_for("ledger.outbox_evidence") == f"ledger.{horizon_table.name}"
    assert horizon_table_for("ledger.evidence_view") == f"ledger.{horizon_table.name}"


@dataclass
class EvidenceDB:
    url: str
    revision: str

    @property
    def has_horizon(self) -> bool:
        return self.revision != "outbox_0001"

    def engine(self) -> sa.Engine:
        return sa.create_engine(self.url)


@pytest.fixture(params=DATABASES, ids=[f"{kind}-{rev}" for kind, rev in DATABASES])
def evidence_db(request: pytest.FixtureRequest, tmp_path: Path) -> EvidenceDB:
    kind, revision = request.param
    if kind == "postgresql":
        url = fresh_database(request.getfixturevalue("postgres_url"), revision)
    else:
        url = f"sqlite:///{tmp_path / 'evidence.db'}"
        migrations.upgrade(url, revision)
    return EvidenceDB(url, revision)


def at(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def add_rows(engine: sa.Engine, group: str, rows: dict[str, int]) -> None:
    """Evidence rows of ``group``: transaction id -> created (Unix ms)."""
    with engine.begin() as conn:
        conn.execute(
            evidence_table.insert(),
            [
                {"txn_id": t, "kind": "evidence", "producer_group": group, "created_at": at(ms)}
                for t, ms in rows.items()
            ],
        )


@pytest.mark.integration
def test_the_horizon_is_read_once_pruned_and_is_none_without_its_table(
    spark: Any, evidence_db: EvidenceDB
) -> None:
    assert read_horizon(spark, evidence_db.url) is None  # never pruned, or no such table
    if evidence_db.has_horizon:
        engine = evidence_db.engine()
        pruned = prune_evidence(engine, now=at(1_795_000_000_000))
        engine.dispose()
        assert read_horizon(spark, evidence_db.url) == int(pruned.pruned_before.timestamp() * 1000)


@pytest.mark.integration
def test_a_schema_qualified_evidence_table_has_its_horizon_beside_it(
    spark: Any, postgres_url: str
) -> None:
    url = fresh_database(postgres_url)  # the default schema's horizon table: never pruned
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA ledger"))
        beside = horizon_table.to_metadata(sa.MetaData(), schema="ledger")
        beside.create(conn)
        conn.execute(beside.insert(), {"id": 1, "pruned_before_ms": 1_795_000_000_000})
    engine.dispose()

    assert read_horizon(spark, url, table="ledger.outbox_evidence") == 1_795_000_000_000
    assert read_horizon(spark, url) is None


class Committing:
    """A ``TransactionListener`` whose local transaction always commits."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT


@dataclass
class Written:
    """Committed, promoted transactions on one set of topics, none with an evidence row yet."""

    prefix: str
    group: str
    now_ms: int
    listener: str  # through TransactionalProducer
    unproven: str  # the decorator's form, began now
    pruned: str  # began long before the horizon
    after_horizon: str  # began just after the horizon and its margin
    proven: str  # its row is added with each database

    @property
    def horizon_ms(self) -> int:
        """The horizon ``prune_evidence(now=now_ms)`` records with the default retention."""
        return self.now_ms - int(DEFAULT_RETENTION.total_seconds() * 1000)


@pytest.fixture(scope="module")
def written(kafka_bootstrap: str) -> Written:
    topic = unique("orders")
    create_topic(kafka_bootstrap, topic, partitions=2)
    group = unique("shop")
    w = StreamWriter(kafka_bootstrap, prefix=unique("__outbox-forms"), partitions=3, group=group)
    now_ms = int(time.time() * 1000)
    horizon_ms = now_ms - int(DEFAULT_RETENTION.total_seconds() * 1000)
    ids = {
        "unproven": None,
        "pruned": txn_id_at(now_ms - 20 * DAY_MS),
        "after_horizon": txn_id_at(horizon_ms + PRUNE_MARGIN_MS + 60_000),
        "proven": None,
    }
    txns = {
        name: w.begin([(topic, name.encode(), b"v")], txn_id=txn_id) for name, txn_id in ids.items()
    }
    w.flush()
    for txn in txns.values():
        w.decide(txn, OpState.COMMIT)
        w.promote(txn)
    settings = OutboxSettings(
        bootstrap_servers=kafka_bootstrap,
        producer_group=group,
        topic_prefix=w.topics.prefix,
        partitions=3,
        wait_for_op=True,
    )
    message = Message(topic, b"v", key=b"listener")
    with OutboxProducer(settings) as producer:
        sent = TransactionalProducer(producer, Committing()).send_message_in_transaction(message)
    assert sent.op_written
    half = HalfMessage(topic, b"v", b"listener")
    w.promote(StreamTxn(sent.transaction_id, group, sent.half.partition, [half]))
    w.flush()
    w.close()
    return Written(
        w.topics.prefix,
        group,
        now_ms,
        listener=sent.transaction_id,
        **{name: txn.txn_id for name, txn in txns.items()},
    )


@pytest.mark.integration
def test_commits_without_a_row_are_reported_unless_the_listener_answers_or_it_was_pruned(
    spark: Any, kafka_bootstrap: str, written: Written, evidence_db: EvidenceDB, tmp_path: Path
) -> None:
    # Given the rows the producers wrote, old ones pruned where the database can record it
    engine = evidence_db.engine()
    rows = {written.proven: written.now_ms, written.pruned: written.now_ms - 20 * DAY_MS}
    if evidence_db.has_horizon:
        add_rows(engine, written.group, rows)
        pruned = prune_evidence(engine, now=at(written.now_ms))
        assert pruned.deleted == 1
        horizon = int(pruned.pruned_before.timestamp() * 1000)
        assert horizon == written.horizon_ms
    else:  # the same rows gone, with no horizon to say so
        add_rows(engine, written.group, {written.proven: written.now_ms})
        horizon = None
    engine.dispose()

    # When the topics and the table are audited
    settings = AuditSettings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=written.prefix,
        as_of="now+10m",  # past the grace period and the check window of every record
        evidence_url=evidence_db.url,
        out_dir=str(tmp_path / "audit"),
    )
    result = run_audit(spark, settings)

    # Then only the COMMITs a row should prove and none does are reported
    expected = {written.unproven, written.after_horizon}
    if not evidence_db.has_horizon:
        expected.add(written.pruned)  # no horizon: a missing row is missing
    assert result.txn_ids("commit_without_evidence") == expected
    others = {name: n for name, n in result.counts.items() if name != "commit_without_evidence"}
    assert others == dict.fromkeys((f for f in FINDINGS if f != "commit_without_evidence"), 0)
    assert result.summary["parameters"]["evidence_horizon_ms"] == horizon
    assert result.summary["statistics"]["by_state"]["COMMIT"] == 5
