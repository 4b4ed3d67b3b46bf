"""One check secret for producers and checker, from the environment or a file, rotated with no
pause in checking: the endpoint accepts the new secret and the one it replaces, so the checker
may sign with either while it is rolled over."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

import outbox
from checker import CheckerSettings
from outbox import OutboxProducer, OutboxSettings
from outbox.checks import CHECK_PATH
from outbox.checks.auth import sign
from outbox.checks.handler import CheckHandler, CheckSettings
from outbox.errors import ConfigurationError
from outbox.protocol import LocalTransactionState, new_transaction_id
from outbox.protocol.check import CheckedTransaction
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, order_ids, orders

OLD, NEW = "old-check-secret", "new-check-secret"


class Committed:
    def resolve(self, checks: Sequence[CheckedTransaction]) -> dict[str, LocalTransactionState]:
        return {c.txn_id: LocalTransactionState.COMMIT for c in checks}


def status(handler: CheckHandler, secret: str) -> int:
    body = json.dumps({"txn_ids": [new_transaction_id()]}).encode()
    headers = sign(secret.encode(), "POST", CHECK_PATH, body)
    return handler.handle(method="POST", path=CHECK_PATH, headers=headers, body=body).status


def test_while_rotating_the_endpoint_accepts_the_new_and_the_previous_secret_only() -> None:
    rotating = CheckHandler(
        CheckSettings(secret=NEW.encode(), previous_secret=OLD.encode()), Committed()
    )
    assert [status(rotating, s) for s in (NEW, OLD, "another")] == [200, 200, 401]
    settled = CheckHandler(CheckSettings(secret=NEW.encode()), Committed())
    assert [status(settled, s) for s in (NEW, OLD)] == [200, 401]
    with pytest.raises(ConfigurationError, match="OUTBOX_CHECK_PREVIOUS_SECRET"):
        CheckSettings(previous_secret=OLD.encode(), insecure_local=True)


def test_an_empty_secret_is_none_and_a_garbled_signature_is_refused() -> None:
    # "" (an unset Secret key) with insecure_local: unsigned requests answered, as the checker
    # sends them for an empty secret (before: every request refused)
    local = CheckHandler(CheckSettings(secret=b"", insecure_local=True), Committed())
    body = json.dumps({"txn_ids": [new_transaction_id()]}).encode()
    assert local.handle(method="POST", path=CHECK_PATH, headers={}, body=body).status == 200
    # a signature header that is not ASCII is a wrong signature, not a server error
    guarded = CheckHandler(CheckSettings(secret=NEW.encode()), Committed())
    headers = {**sign(NEW.encode(), "POST", CHECK_PATH, body), "x-outbox-signature": "é" * 64}
    assert guarded.handle(method="POST", path=CHECK_PATH, headers=headers, body=body).status == 401


@pytest.mark.integration
def test_a_secret_passed_in_code_keeps_the_settings_previous_one(
    outbox_settings: OutboxSettings, engine: sa.Engine
) -> None:
    settings = dataclasses.replace(outbox_settings, check_previous_secret=OLD, check_secret=NEW)
    with OutboxProducer(settings) as producer:
        server = producer.serve_checks(engine=engine, secret=NEW)  # the old docs' pattern
        for secret, expected in ((NEW, 200), (OLD, 200), ("another", 401)):
            body = json.dumps({"txn_ids": [new_transaction_id()]}).encode()
            request = urllib.request.Request(
                server.url + CHECK_PATH,
                data=body,
                headers=sign(secret.encode(), "POST", CHECK_PATH, body),
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    status = response.status
            except urllib.error.HTTPError as err:
                status = err.code
            assert status == expected, secret


@pytest.mark.integration
def test_a_checker_signing_with_the_old_or_the_new_secret_is_answered_while_rotating(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    engine: sa.Engine,
    session_factory: sessionmaker,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # Given producers rolled out mid-rotation: the new secret from a mounted file, the old one
    # still accepted, and the endpoint configured by the settings alone
    (tmp_path / "check-secret").write_text(NEW + "\n")
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_PRODUCER_GROUP": outbox_settings.producer_group,
        "OUTBOX_CHECK_SECRET_FILE": str(tmp_path / "check-secret"),
        "OUTBOX_CHECK_PREVIOUS_SECRET": OLD,
    }
    from_env = OutboxSettings.from_env(env)
    settings = dataclasses.replace(
        outbox_settings,
        check_secret=from_env.check_secret,
        check_previous_secret=from_env.check_previous_secret,
    )
    assert (settings.check_secret, settings.check_previous_secret) == (NEW, OLD)
    with OutboxProducer(settings) as producer:
        producer.serve_checks(engine=engine)

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(order_id: str, topic: str, *, session: sa.orm.Session) -> str:
            outbox.send(topic, order_id, key=order_id)
            session.execute(orders.insert().values(id=order_id, amount=1))
            return outbox.current_transaction().txn_id

        # When a checker still on the old secret, then one on the new (read from the same
        # shared variable's file), each settle a transaction whose op was lost
        checker_new = CheckerSettings.from_env(
            {"OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap, **env}
        ).secret
        assert checker_new == NEW
        for secret in (OLD, checker_new):
            with pipeline(kafka_bootstrap, topics, secret=secret) as running:
                order_id = f"rotated-{uuid.uuid4().hex[:8]}"
                with ops_lost(producer, monkeypatch):
                    txn_id = place(order_id, running.topic)
                # Then each is answered: committed, in the database and delivered once
                assert running.decided([txn_id]) == {txn_id: "COMMIT"}
                assert order_id in order_ids(engine)
                assert running.settle(lambda o=order_id: {o}) == {order_id: 1}
