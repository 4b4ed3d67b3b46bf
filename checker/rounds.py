"""One check round: the due transactions asked about, the answers turned into what to write.

Answers are applied to the tracker as they come (a COMMIT or ROLLBACK decides the transaction,
an UNKNOWN counts a check); what they mean on the topics goes into a :class:`RoundPlan` that the
session writes in one Kafka transaction. Should that transaction not commit, the session starts
over from its committed positions and this round's effects are gone with its tracker.

RocketMQ's rules, with ours on top: a COMMIT answer names the whole transaction or it is given
up instead (``why_incomplete``); UNKNOWN answers count toward ``check_max``, a group that does not
answer toward ``no_producer_timeout_s``; a group whose recent checks are mostly UNKNOWN or failing
is paused by its circuit breaker, its transactions staying due without losing an attempt.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed

from checker.breaker import Breaker
from checker.client import CheckClient, NoAnswer
from checker.instances import LiveInstances
from checker.plan import CheckerStats, RoundPlan
from checker.settings import CheckerSettings
from checker.tracing import decision
from checker.tracker import Pending, Tracker
from checker.writer import Refusals
from outbox import tracing
from outbox.fetch import HalfFetcher
from outbox.logs import fields
from outbox.protocol.check import CheckedTransaction, split_requests
from outbox.protocol.completeness import why_incomplete
from outbox.protocol.op import OpRecord
from outbox.protocol.states import DecidedBy, LocalTransactionState, OpState

log = logging.getLogger("checker")
Answers = dict[str, LocalTransactionState]


def with_records(entry: Pending, fetcher: HalfFetcher) -> Pending:
    """A resumed transaction whose copies were read before its RESUMED op: fetch them (some
    may have been read before it and some after, the two topics being read together)."""
    if len(entry.records) < len(entry.resumed_offsets):
        found = fetcher.fetch(entry.partition, entry.resumed_offsets, entry.txn_id)
        entry.resumed_offsets = ()  # fetched: a copy gone now stays gone (no second read)
        for record in found or ():
            entry.records.setdefault(record.index, record)
    return entry


class CheckRound:
    """Plans rounds for one session (see the module docstring)."""

    def __init__(
        self,
        settings: CheckerSettings,
        tracker: Tracker,
        *,
        client: CheckClient,
        instances: LiveInstances,
        fetcher: HalfFetcher,
        breakers: dict[str, Breaker],
        refusals: Refusals,
        stats: CheckerStats,
        caught_up: Callable[[set[int]], set[int]],
        read_halves_to_end: Callable[[set[int]], bool],
        pool: ThreadPoolExecutor,
    ) -> None:
        self.settings = settings
        self.tracker = tracker
        self.client = client
        self.instances = instances
        self.fetcher = fetcher
        self.breakers = breakers
        self.refusals = refusals
        self.stats = stats
        self.caught_up = caught_up
        self.read_halves_to_end = read_halves_to_end
        self.pool = pool

    def plan(self, now_ms: int) -> RoundPlan:
        plan = RoundPlan()
        due = self.tracker.due(now_ms)
        if not due:
            return plan
        ready = self.caught_up({p.partition for p in due})
        by_group: dict[str, list[Pending]] = defaultdict(list)
        for entry in due:
            if entry.partition in ready:
                by_group[entry.group].append(entry)
        batches = [
            (group, batch)
            for group, entries in by_group.items()
            if self.breakers[group].allows(now_ms / 1000)  # paused groups stay due, unpenalised
            for batch in self._requests(entries, plan, now_ms)
        ]
        # Back-pressure: at most this many requests per round; the rest stay due for the next.
        batches = batches[: self.settings.check_concurrency * 2]
        for _, batch in batches:
            for entry, _ in batch:
                if entry.orphaned and not entry.reported:
                    self._report_orphan(entry)
        futures = {
            self.pool.submit(self._ask, group, [checked for _, checked in batch], now_ms): (
                group,
                [entry for entry, _ in batch],
            )
            for group, batch in batches
        }
        answered = [(*futures[f], f.result()) for f in as_completed(futures)]
        # One read to the end of every half partition a COMMIT answer names, for the round.
        commit_partitions = {
            entry.partition
            for _, entries, result in answered
            if not isinstance(result, NoAnswer)
            for entry in entries
            if result[entry.txn_id] is LocalTransactionState.COMMIT
        }
        halves_read = not commit_partitions or self.read_halves_to_end(commit_partitions)
        for group, entries, result in answered:
            self._apply(group, entries, result, now_ms, plan, halves_read=halves_read)
        return plan

    # -- asking ----------------------------------------------------------------------------

    def _requests(
        self, entries: list[Pending], plan: RoundPlan, now_ms: int
    ) -> list[list[tuple[Pending, CheckedTransaction]]]:
        """The check requests for one group's due transactions, each carrying the first half
        record in hand of every transaction it asks about (its ``check_by`` routes the check at
        the endpoint; its message is what ``check_local_transaction`` receives). A transaction
        with no half record left to read (a resumed one whose copies are gone) is not asked
        about: it is given up, as nothing of it could be delivered."""
        checked: dict[str, tuple[Pending, CheckedTransaction]] = {}
        for entry in entries:
            entry = self._with_records(entry)
            if not entry.records:
                self._give_up(entry, "none of its half records is left to read", plan, now_ms)
                continue
            first = entry.records[min(entry.records)]
            checked[entry.txn_id] = (
                entry,
                CheckedTransaction(entry.txn_id, first.check_by, entry.checks, first),
            )
        splits = split_requests(
            (c for _, c in checked.values()),
            max_ids=self.settings.batch_size,
            max_bytes=self.settings.request_max_bytes,
        )
        return [[checked[c.txn_id] for c in split] for split in splits]

    def _report_orphan(self, entry: Pending) -> None:
        """Once caught up, an orphan still pending is no decided transaction's copy read before
        its op: report it as it is first asked about."""
        entry.reported = True
        self.stats.orphans += 1
        first = entry.records[min(entry.records)]
        log.warning(
            "transaction %s of group %s: its original half records (offsets %s of partition "
            "%d) were removed by retention before this checker group read them (the group is "
            "new, or was stopped for longer than the half topic's retention.ms); checked from "
            "its put-back copy at offset %d",
            entry.txn_id,
            entry.group,
            entry.offsets,
            entry.partition,
            first.offset,
            extra=fields(txn_id=entry.txn_id, group=entry.group, partition=entry.partition),
        )

    def _ask(
        self, group: str, transactions: list[CheckedTransaction], now_ms: int
    ) -> Answers | NoAnswer:
        """Runs in a worker thread: HTTP only, no Kafka client is touched here. Instances are
        judged live as of the round's start (``now_ms``), when the registry was last read: a
        worker starting late in a long round would otherwise age them past the TTL in a view
        that did not move meanwhile."""
        instances = self.instances.pick(group, self.settings.failover_attempts, now_ms)
        if not instances:
            unread = self.instances.unread
            if unread is not None:
                return NoAnswer(f"{unread}: no live instance known", asked=False, known=False)
            return NoAnswer(f"no live instance of producer group {group!r}", asked=False)
        try:
            return self.client.check(instances, transactions)
        except NoAnswer as err:
            if self.instances.unread is not None:  # the ones asked may be stale: not held
                return NoAnswer(str(err), known=False)  # against the group
            return err

    # -- answers ---------------------------------------------------------------------------

    def _apply(
        self,
        group: str,
        entries: list[Pending],
        result: Answers | NoAnswer,
        now_ms: int,
        plan: RoundPlan,
        *,
        halves_read: bool,
    ) -> None:
        if isinstance(result, NoAnswer):
            if not result.known:  # no check counted, no unreachable time started
                self.stats.held += len(entries)
                for entry in entries:
                    self.tracker.hold(entry, now_ms)
                return
            if result.asked:
                self._trip(group, [True] * len(entries), now_ms)
            # only the tracker's entries: one read again meanwhile (below) is due again, and a
            # GIVEN_UP must name and dead-letter every record of the transaction
            self._unreachable([e for e in entries if self._current(e)], now_ms, str(result), plan)
            return
        self.stats.checks += len(entries)
        unknown = [result[e.txn_id] is LocalTransactionState.UNKNOWN for e in entries]
        self._trip(group, unknown, now_ms)
        commits = any(result[e.txn_id] is LocalTransactionState.COMMIT for e in entries)
        if commits and not halves_read:
            log.warning("half partitions not read to their end in time; answers applied later")
            return  # still due: checked again next round, no attempt counted
        for entry in entries:
            # Still the tracker's entry: not decided meanwhile by another op, nor read again
            # into a new one by a rebalance served while the halves were read to their end (the
            # same partition given back) - the entry asked about may miss records the new one
            # has, and a COMMIT names exactly the records of the entry it is decided on. A
            # replaced entry is due, and asked again next round.
            if self._current(entry):
                self._answered(entry, result[entry.txn_id], now_ms, plan)

    def _current(self, entry: Pending) -> bool:
        return self.tracker.pending.get(entry.txn_id) is entry

    def _trip(self, group: str, bad: list[bool], now_ms: int) -> None:
        breaker = self.breakers[group]
        if any([breaker.record(b, now_ms / 1000) for b in bad]):
            self.stats.breaker_trips += 1
            log.error(
                "circuit breaker open for producer group %r for %.0f s: most recent checks "
                "answered UNKNOWN or failed",
                group,
                breaker.cooldown_s,
            )

    def _answered(
        self, entry: Pending, state: LocalTransactionState, now_ms: int, plan: RoundPlan
    ) -> None:
        if state is LocalTransactionState.COMMIT:
            self._commit(entry, plan, now_ms)
        elif state is LocalTransactionState.ROLLBACK:
            self._decide(entry, OpState.ROLLBACK, None, plan, now_ms)
        else:
            self.stats.unknown += 1
            self.tracker.unknown(entry, now_ms)
            if entry.checks >= self.settings.check_max:
                self._give_up(entry, f"still UNKNOWN after {entry.checks} checks", plan, now_ms)
            else:
                plan.states.append((entry.partition, entry.txn_id, entry.count()))

    def _commit(self, entry: Pending, plan: RoundPlan, now_ms: int) -> None:
        """A COMMIT names the whole transaction or is not written. The half partition was read
        to its end first, so a message still missing was removed by retention, was never
        written, or did not decode (the relay dead-letters those): the transaction is given up
        instead, what is in hand dead-lettered, and none of it delivered."""
        entry = self._with_records(entry)
        why = why_incomplete(entry.records.values())
        if why is None:
            self._decide(entry, OpState.COMMIT, None, plan, now_ms)
            return
        self._give_up(
            entry,
            f"its producer answered COMMIT, but {why}; delivering the rest would deliver part "
            "of the transaction: re-send its messages from their source",
            plan,
            now_ms,
            incomplete=True,
        )

    def _unreachable(self, entries: list[Pending], now_ms: int, why: str, plan: RoundPlan) -> None:
        self.stats.unreachable += len(entries)
        limit_ms = int(self.settings.no_producer_timeout_s * 1000)
        for entry in entries:
            started = entry.unreachable_since_ms is None
            if self.tracker.unreachable(entry, now_ms) >= limit_ms:
                reason = f"no producer of group {entry.group!r} answered: {why}"
                self._give_up(entry, reason, plan, now_ms)
            elif started:  # when it began survives a restart, so the limit is the limit
                plan.states.append((entry.partition, entry.txn_id, entry.count()))

    def _with_records(self, entry: Pending) -> Pending:
        return with_records(entry, self.fetcher)

    def _give_up(
        self,
        entry: Pending,
        reason: str,
        plan: RoundPlan,
        now_ms: int,
        *,
        incomplete: bool = False,
    ) -> None:
        """Dead-letter copies of its records, then the GIVEN_UP op, in the same round."""
        entry = self._with_records(entry)
        log.error(
            "giving up transaction %s of group %s: %s",
            entry.txn_id,
            entry.group,
            reason,
            extra=fields(
                txn_id=entry.txn_id,
                group=entry.group,
                partition=entry.partition,
                offsets=entry.offsets,
            ),
        )
        for index in sorted(entry.records):
            plan.letters.append((entry.records[index], reason))
        self._decide(entry, OpState.GIVEN_UP, reason, plan, now_ms, incomplete)

    def _decide(
        self,
        entry: Pending,
        state: OpState,
        reason: str | None,
        plan: RoundPlan,
        now_ms: int,
        incomplete: bool = False,
    ) -> None:
        if self.refusals.op_refused(entry.txn_id):
            self.tracker.later(entry, now_ms)  # its op was refused: again after the interval
            plan.letters = [(r, why) for r, why in plan.letters if r.txn_id != entry.txn_id]
            return
        entry = self._with_records(entry)
        op = OpRecord(
            txn_id=entry.txn_id,
            state=state,
            producer_group=entry.group,
            half_partition=entry.partition,
            half_offsets=tuple(entry.offsets),
            decided_by=DecidedBy.CHECKER,
            decided_at_ms=int(time.time() * 1000),
            reason=reason,
        )
        plan.decision(op, incomplete=incomplete)
        if tracing.otel is not None and (span := decision(tracing.otel, entry, op)) is not None:
            plan.spans.append(span)
        if entry.checks or entry.unreachable_since_ms is not None:
            plan.states.append((entry.partition, entry.txn_id, None))  # forget its count
        self.tracker.wrote(entry.txn_id, state, entry.partition, now_ms)
