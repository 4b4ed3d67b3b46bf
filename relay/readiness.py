"""What the relay's readiness says of its place in the group: whether it holds partition pairs
to promote, and if not, whether that is as it should be (a standby) or why.

Readiness is what holds a rolling update (Kubernetes' readinessProbe on ``/readyz``). A relay
that reads nothing must not pass it, yet one the group assigns nothing (more instances than
partitions) is a standby and ready. So a relay is not ready:

- until the group has answered it (its first assignment);
- while Kafka refuses it its group or a topic it reads (an ACL missing:
  :mod:`outbox.consumer_errors` says which to grant), pairs held or not: a topic it may describe
  but not read is assigned, and fails each fetch;
- while the group gave it a half or op partition alone and no pair (a topic it may not describe
  is left out of its subscription, so its partner's partitions come alone);
- until it has held pairs for :data:`SETTLE_S` without a break in this session (a rebalance
  before then starts it again), unless a Kafka transaction commits sooner: a session that fails
  at its first Kafka transaction (a topic it may describe but not read) would otherwise say ready
  for the moment between its assignment and the failure, in every session of its restart loop
  (measured: 30-250 ms of each ~1.1 s loop; a probe that lands there once lets a rolling update
  on).

librdkafka says a refusal once, not on each retry. So a refusal holds until the consumer reads
the topic it named to its end, a Kafka transaction commits (it sends both topics' offsets to the
group), or, one of the group, until an assignment whose half and op partitions match. An
assignment of nothing ends any refusal: a standby reads nothing either way, and one given
partitions later is refused them again (a topic left out comes alone; a fetch is refused).
Errors read in the same poll as the assignment count as said before it. Between a revoke (or a
loss) and the next assignment it stays as ready as it was, saying it is rebalancing, unless
refused meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from outbox.consumer_errors import ConsumerErrors
from outbox.service_health import Health
from relay.partitions import Partitions

#: Readiness while the group has not assigned this instance anything yet.
JOINING = "subscribed; joining the group"
#: How long a session holds pairs before it says ready (a commit says it sooner: relay.batch).
SETTLE_S = 5.0


class GroupReadiness:
    """Keeps ``health``'s readiness in step with this session's place in the group:
    ``partitions`` held, the consumer's ``errors``; ``after_failure``: why the session before
    failed, if it did (said while this one settles). The loop calls :meth:`update` once a turn,
    after routing what it read; the batch calls :meth:`committed` after each Kafka transaction.
    Once one committed, readiness says so (``; committing``)."""

    def __init__(
        self,
        health: Health,
        partitions: Partitions,
        errors: ConsumerErrors,
        *,
        after_failure: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.health = health
        self.partitions = partitions
        self.errors = errors
        self.after_failure = after_failure
        self.clock = clock
        self._assignments = 0
        self._paired_at: float | None = None  # when pairs were first held
        self._settled = False
        self._committed = False  # a Kafka transaction committed in this session
        self._given_nothing = False  # the last assignment was of nothing: a standby
        self._said: tuple[bool, str] = (False, JOINING)
        health.set_ready(*self._said)

    def update(self, assignments: int, given_nothing: bool = False) -> None:
        """``assignments``: how many times the group has assigned this member partitions (or
        none) so far, a new one may end a refusal; ``given_nothing``: the last one was of
        nothing (told by the rebalance, not read from what is held now: a revoke served in the
        same turn would look the same)."""
        if assignments != self._assignments:
            self._assignments = assignments
            self._given_nothing = given_nothing
            if not self._settled:
                self._paired_at = None  # pairs held without a break: counted from here
            half, op = self.partitions.assigned
            # the group answered, and sees both topics: a refusal of the group is over, and
            # with nothing to read (a standby) any other
            if half == op and (not half or self.errors.refused_topic is None):
                self.errors.clear()
        elif self._said[0] and self.partitions.states and self.errors.refused is None:
            return  # the common case, a relay promoting: nothing to build
        if not self._settled:  # 5 s of pairs held in a row, in this session
            if not self.partitions.states:
                self._paired_at = None
            else:
                now = self.clock()
                if self._paired_at is None:
                    self._paired_at = now
                self._settled = now - self._paired_at >= SETTLE_S
        self._say(self.verdict())

    def committed(self) -> None:
        """A Kafka transaction committed (:mod:`relay.batch`): it sent the group both topics'
        offsets for the pairs it acted on, which Kafka refuses without Read on the group and
        on both: settled, and no refusal holds. (An ACL revoked may reach a topic's leader
        before the group's coordinator: a fetch refused just before is then forgotten, until
        the next transaction fails on it and the session starts over.)"""
        self._settled = self._committed = True
        self.errors.refusal_over()
        self._say(self.verdict())

    def _say(self, verdict: tuple[bool, str]) -> None:
        if verdict != self._said:
            self._said = verdict
            self.health.set_ready(*verdict)

    def verdict(self) -> tuple[bool, str]:
        """Ready or not, and why, as of the last :meth:`update` or :meth:`committed`."""
        states = self.partitions.states
        refused = self.errors.refused
        if states:
            held = f"assigned partitions {sorted(states)}"
            if refused is not None:
                return False, f"{held}; {refused}"
            if not self._settled:
                after = "" if self.after_failure is None else f" after: {self.after_failure}"
                return False, f"{held}; settling for {SETTLE_S:.0f} s{after}"
            return True, f"{held}; committing" if self._committed else held
        if self._assignments == 0:  # with why, if the consumer said (a topic missing too)
            said = refused or self.errors.last
            return False, JOINING if said is None else f"{JOINING}; {said}"
        if refused is not None:
            return False, f"no partition assigned; {refused}"
        half, op = self.partitions.assigned
        if half != op:
            return False, f"no partition pair assigned: {_unpaired(half, op)}"
        if not self._given_nothing:  # let go (revoked, lost) until the next assignment
            return self._said[0], "no partition assigned: rebalancing"
        return True, "no partition assigned: a standby (more instances than partitions)"


def _unpaired(half: frozenset[int], op: frozenset[int]) -> str:
    """What a member assigned half and op partitions without a pair is to do."""
    held = f"half partitions {sorted(half)}, op partitions {sorted(op)}"
    counts = "the two topics' partition counts differ (grow the smaller one)"
    if not half or not op:
        missing = "half" if not half else "op"
        return (
            f"{held}: the {missing} topic is not in its subscription (grant its principal "
            f"Describe and Read on it, or make it: kafka-outbox topics ensure), or {counts}"
        )
    return f"{held}: {counts}"
