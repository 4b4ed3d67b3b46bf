"""A check round decides on what the tracker holds when it writes, not on what it held when it
asked.

Before a COMMIT is written, the round reads every half partition it names to its end
(``Session._read_halves_to_end``); that read polls the group's consumer, so a rebalance can be
served inside it. When the same half partition comes back to this checker, the tracker drops
the partition's transactions and reads them again into new entries, the records the round was
missing among them. The round once decided on the entry it had asked about: a COMMIT naming only
the records read before the rebalance, which the relay promoted as the whole transaction (its
messages carry no count when sent one by one) - part of a committed transaction delivered, the
rest lost without a word (found by the Spark audit of the three-broker fault test).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from checker.breaker import Breaker
from checker.plan import CheckerStats
from checker.rounds import CheckRound
from checker.settings import CheckerSettings
from checker.tracker import Tracker
from checker.writer import Refusals
from outbox.protocol import HalfMessage, HalfRecord, OpState
from outbox.protocol.state import CheckCount
from outbox.protocol.states import LocalTransactionState

TXN = "01a203d8-301f-7701-b6f4-468000000001"
PARTITION = 2


def half(
    offset: int, index: int, timestamp_ms: int, txn_id: str = TXN, group: str = "orders"
) -> HalfRecord:
    """A half record sent by ``txn.send()``: its transaction's message count unknown."""
    return HalfRecord(
        txn_id=txn_id,
        producer_group=group,
        message=HalfMessage("orders", f"order/{index}".encode()),
        index=index,
        count=None,
        created_at_ms=timestamp_ms,
        check_count=0,
        partition=PARTITION,
        offset=offset,
        timestamp_ms=timestamp_ms,
    )


class Committed:
    """A producer that answers COMMIT for every transaction it is asked about."""

    def check(self, instances: Sequence[Any], transactions: Sequence[Any]) -> Any:
        return {t.txn_id: LocalTransactionState.COMMIT for t in transactions}


class OneInstance:
    """One live instance of group ``orders``; none of any other group."""

    unread = None

    def pick(self, group: str, n: int, now_ms: int) -> list[str]:
        return ["instance"] if group == "orders" else []


def check_round(
    tracker: Tracker,
    read_halves_to_end: Callable[[set[int]], bool],
    pool: ThreadPoolExecutor,
    **settings: Any,
) -> CheckRound:
    """The real round, its producers :class:`Committed`, its registry :class:`OneInstance`."""
    return CheckRound(
        CheckerSettings(bootstrap_servers="127.0.0.1:9092", insecure_local=True, **settings),
        tracker,
        client=Committed(),  # type: ignore[arg-type]
        instances=OneInstance(),  # type: ignore[arg-type]
        fetcher=None,  # type: ignore[arg-type]
        breakers=defaultdict(Breaker),
        refusals=Refusals(),
        stats=CheckerStats(),
        caught_up=lambda partitions: partitions,
        read_halves_to_end=read_halves_to_end,
        pool=pool,
    )


def test_a_rebalance_during_the_read_to_the_end_does_not_commit_part_of_a_transaction() -> None:
    tracker = Tracker(timeout_ms=6_000, interval_ms=30_000)
    tracker.reading_from(PARTITION, 3600)
    # Given a transaction of two messages whose first half (3660) was read, the second (3663)
    # not yet fetched (its partition's leader moving)
    tracker.add_half(half(3660, 0, 1_000))
    rebalanced: list[int] = []

    def read_halves_to_end(partitions: set[int]) -> bool:
        # what the consumer's poll inside Session._read_halves_to_end does when the group
        # rebalances and gives the same half partition back
        if not rebalanced:
            rebalanced.append(PARTITION)
            tracker.drop_partition(PARTITION)  # Session._on_revoke
            tracker.reading_from(PARTITION, 3600)  # Session._on_assign, from the committed position
            tracker.add_half(half(3660, 0, 1_000))  # read again from there ...
            tracker.add_half(half(3663, 1, 1_500))  # ... to the end: both halves, in a new entry
        return True

    pool = ThreadPoolExecutor(1)
    round_ = check_round(tracker, read_halves_to_end, pool)
    try:
        # When the producer answers COMMIT and the group rebalances during the read to the end
        first = round_.plan(now_ms=10_000)
        # Then nothing is decided on the entry asked about, which misses the second half
        assert rebalanced == [PARTITION]
        assert [op.half_offsets for op in first.ops] == []
        # And the transaction, read again whole, is decided by a later round: both halves named
        second = round_.plan(now_ms=10_000 + 30_000)
    finally:
        pool.shutdown()
    [op] = second.ops
    assert (op.state, op.half_offsets) == (OpState.COMMIT, (3660, 3663))
    assert TXN not in tracker.pending


def test_a_rebalance_during_the_read_to_the_end_gives_up_no_part_of_a_transaction() -> None:
    """The same for a transaction of another group, whose producers have been gone for longer
    than ``no_producer_timeout_s``: the round's read to the end (for the COMMIT of the first
    group) must not leave it given up with only the records read before the rebalance - its
    GIVEN_UP would name, and dead-letter, part of the transaction."""
    gone = "01a203d8-301f-7701-b6f4-468000000002"
    tracker = Tracker(timeout_ms=6_000, interval_ms=30_000)
    tracker.reading_from(PARTITION, 3600)
    tracker.add_half(half(3660, 0, 1_000))
    tracker.add_half(half(3661, 0, 1_000, txn_id=gone, group="billing"))
    tracker.pending[gone].unreachable_since_ms = 0  # no producer of it for ten seconds now
    rebalanced: list[int] = []

    def read_halves_to_end(partitions: set[int]) -> bool:
        if not rebalanced:
            rebalanced.append(PARTITION)
            tracker.drop_partition(PARTITION)
            tracker.reading_from(PARTITION, 3600)
            # its count, read back from the state topic as Session._on_assign does
            tracker.restored[gone] = (PARTITION, CheckCount(checks=0, unreachable_since_ms=0))
            tracker.add_half(half(3660, 0, 1_000))
            tracker.add_half(half(3661, 0, 1_000, txn_id=gone, group="billing"))
            tracker.add_half(half(3663, 1, 1_500))
            tracker.add_half(half(3664, 1, 1_500, txn_id=gone, group="billing"))
        return True

    pool = ThreadPoolExecutor(2)
    round_ = check_round(tracker, read_halves_to_end, pool, no_producer_timeout_s=1)
    try:
        first = round_.plan(now_ms=10_000)
        assert rebalanced == [PARTITION]
        assert [(op.txn_id, op.half_offsets) for op in first.ops] == []
        assert first.letters == []
        second = round_.plan(now_ms=10_000 + 30_000)
    finally:
        pool.shutdown()
    decided = {op.txn_id: (op.state, op.half_offsets) for op in second.ops}
    assert decided == {
        TXN: (OpState.COMMIT, (3660, 3663)),
        gone: (OpState.GIVEN_UP, (3661, 3664)),
    }
    assert sorted(r.offset for r, _ in second.letters) == [3661, 3664]


def test_a_decision_read_back_after_a_rebalance_is_not_asked_about_and_decided_again() -> None:
    """A partition revoked after a round wrote its decision, before the op was read back, and
    given back: the transaction is read again from the committed position (held back by one
    pending before it) and its op read back (what ``Session._op`` does) must decide it, not be
    taken for a decision still known. The session once kept its own decisions past a revoke and
    swallowed the op - the transaction was asked about and decided a second time, a GIVEN_UP's
    records dead-lettered twice; that glue is gone, so this walks the tracker's side of it."""
    tracker = Tracker(timeout_ms=6_000, interval_ms=30_000)
    tracker.reading_from(PARTITION, 3600)
    tracker.add_half(half(3660, 0, 1_000))
    pool = ThreadPoolExecutor(1)
    round_ = check_round(tracker, lambda partitions: True, pool)
    try:
        [op] = round_.plan(now_ms=10_000).ops  # written with the round's Kafka transaction
        tracker.drop_partition(PARTITION)  # Session._on_revoke, before the op was read back
        tracker.reading_from(PARTITION, 3600)  # Session._on_assign: from the committed position
        tracker.add_half(half(3660, 0, 1_000))  # read again: pending again
        assert tracker.decide(TXN, op.state, PARTITION, 10_001) is not None  # Session._op
        later = round_.plan(now_ms=10_000 + 30_000)
    finally:
        pool.shutdown()
    assert later.ops == [] and TXN not in tracker.pending
