"""A checker outlives its broker's restart: what fell due while the broker was away is decided
once it is back, once, and nothing is given up.

With its one broker away the checker's loop stalls on its own Kafka calls (its round's
transaction, its consumer's fetch): no check is decided and nothing counts toward giving up.
What must follow the broker's return is the rest: the round's transaction the broker aborted,
the producer's heartbeats missing from the registry for as long as it was away, the consumer's
positions - and the checker deciding again, as ``python -m checker`` runs under a supervisor
that starts it again when it exits stuck (code 3, :mod:`outbox.watchdog`).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from outbox import OutboxProducer, migrations
from outbox.protocol import DecidedBy, OpState
from outbox.testing import HarnessSettings
from tests.checker.processes import CheckerProcess
from tests.checker.test_checker import SECRET, wait_for
from tests.kafka_helpers import unique
from tests.outbox.test_broker_down import late_settings, pausable_broker
from tests.producer_fixtures import Topics
from tests.relay.test_relay import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.broker_guard]

#: The broker is away for longer than a check round's Kafka timeouts, the registry's TTL (the
#: producer's heartbeats stop with it) and the time a group may go without a live instance
#: before its transactions are given up; a transaction's first check is due while it is.
DOWN_S, FIRST_CHECK_S, REGISTRY_TTL_S, NO_PRODUCER_TIMEOUT_S = 40.0, 10.0, 15.0, 20.0

#: What fell due is decided within this many seconds of the broker's return: the session timeout
#: (10 s), the new session's join, a check round, with room for a slow machine.
RESUMED_WITHIN_S = 30.0


@pytest.mark.timeout(900)  # the broker's two starts, its 40 s away, a stuck checker's exit
def test_what_fell_due_while_the_broker_was_away_is_decided_once_it_is_back(
    harness_settings: HarnessSettings, tmp_path: Path, sqlite_url: str
) -> None:
    migrations.upgrade(sqlite_url)
    engine = sa.create_engine(sqlite_url)
    with pausable_broker(harness_settings, tmp_path) as broker:
        settings = late_settings(broker)  # a send waits out the broker's return
        topics = Topics(broker.bootstrap, settings)
        producer = OutboxProducer(settings)
        checker = CheckerProcess(
            broker.bootstrap,
            settings.topic_prefix,
            unique("checker"),
            "checker-0",
            tmp_path / "checker.log",
            transaction_timeout_s=FIRST_CHECK_S,
            registry_ttl_s=REGISTRY_TTL_S,
            no_producer_timeout_s=NO_PRODUCER_TIMEOUT_S,
        )
        checker.supervise("checker-0")
        try:
            producer.serve_checks(engine=engine, secret=SECRET)
            checker.start()
            wait_for(lambda: checker.get("/readyz")[0] == 200, timeout=120)
            # Given every transaction's op lost (the producer crashed after its COMMIT), so
            # that the checker decides each, and one decided before the broker goes
            producer.kafka.send_op = lambda op: False  # type: ignore[method-assign]
            real = unique("orders")
            factory = sessionmaker(engine)

            def committed() -> str:
                with producer.transaction(factory) as txn:
                    txn.send(real, b"order", key=txn.txn_id.encode())
                return txn.txn_id

            def decided(txn_id: str) -> bool:
                return any(op.txn_id == txn_id for op in topics.ops())

            def pending() -> float | None:
                return checker.metric("outbox_checker_pending")

            before = committed()
            wait_for(lambda: decided(before) and pending() == 0, timeout=60)
            # When one commits and is held by the checker, and the broker goes away before its
            # first check, for longer than the round's timeouts, the registry's TTL and the
            # time without a live instance that gives a group's transactions up
            due = committed()
            since = time.monotonic()
            wait_for(lambda: pending() == 1, timeout=FIRST_CHECK_S / 2)
            broker.kill()
            assert time.monotonic() - since < FIRST_CHECK_S, "checked before the broker went"
            time.sleep(DOWN_S)
            broker.start()
            back = time.monotonic()
            # Then, once it is back, that one is decided, and so is one committed after
            after = committed()
            try:
                wait_for(lambda: decided(due) and decided(after), timeout=240)
            except AssertionError as err:
                raise AssertionError(f"{err}\n{checker.metrics()}\n{checker.tail()}") from err
            resumed_s = time.monotonic() - back
            # And each was decided once, committed by the checker (its producer's answer),
            # naming its own half record: nothing given up, nothing dead-lettered
            ops = topics.ops()
            assert sorted((op.txn_id, op.state, op.decided_by) for op in ops) == sorted(
                (txn_id, OpState.COMMIT, DecidedBy.CHECKER) for txn_id in (before, due, after)
            ), [op.reason for op in ops]
            halves = {h.txn_id: (h.partition, (h.offset,)) for h in topics.halves()}
            assert {op.txn_id: (op.half_partition, op.half_offsets) for op in ops} == halves
            assert read_topic(broker.bootstrap, settings.topics.dead_letter) == []
            # And checks resumed once the group dropped the ended session's member: within
            # the checker's 10 s session timeout and a round, not librdkafka's 45 s (44.7 s was)
            assert resumed_s < RESUMED_WITHIN_S, f"decided {resumed_s:.1f} s after it was back"
            log = checker.log.read_text(errors="replace")
            sessions = log.count("starting a new one")
            # And its clients' refused connections, retried every ~50 ms for 40 s, were logged
            # about once per client (repeats within a minute counted, not logged): 3,627 lines
            # were before
            refused = log.count("Connection refused")
            print(
                f"decided {resumed_s:.1f} s after the broker was back; the checker's sessions "
                f"restarted {sessions} time(s), it exited stuck {checker.stuck_exits} time(s); "
                f"{refused} refused-connection line(s) logged"
            )
            assert refused <= 50, checker.tail()
        finally:
            checker.stop()
            producer.close()
            engine.dispose()
