"""When the relay commits its next Kafka transaction.

A Kafka transaction costs the broker about the same whatever it carries (the coordinator's
writes, a marker per partition, the offsets), so how often the relay commits sets the broker's
work, and how long a promotion waits for the commit sets the latency. The cadence:

- a full batch (``batch_max_records`` read) or ``commit_interval_s`` since the last commit
  commits, whatever was read;
- a poll that caught up (it brought less than a full batch) commits at once if it read an op
  record - the only kind that can make something promotable - and the last Kafka transaction
  is at least ``commit_spacing_s`` old; else the ops wait for the spacing to pass. After a quiet
  spell a promotion commits at once; while records keep coming the commits come the spacing
  apart, each carrying what arrived meanwhile;
- half records alone wait for the interval: the progress they make is a checkpoint, and
  committing it at once would spend a Kafka transaction right before the op that follows.
"""

from __future__ import annotations

from relay.settings import RelaySettings


class CommitCadence:
    """The relay loop's clock for commits: told what each poll read and when a commit was
    made, it says how long the next poll may wait and whether to commit now."""

    def __init__(self, settings: RelaySettings, now: float) -> None:
        self.batch_max = settings.batch_max_records
        self.interval = settings.commit_interval_s
        self.when_caught_up = settings.commit_when_caught_up
        # the interval commits anyway: a longer spacing is the interval
        self.spacing = min(settings.commit_spacing_s, settings.commit_interval_s)
        self.poll_timeout_s = settings.poll_timeout_s
        self.last = now  # the last commit, whether or not it had anything to write
        self.last_transaction = now  # the last commit that wrote a Kafka transaction
        self.read = 0  # records read since the last commit
        self.ops = 0  # of which op records
        self.caught_up = False

    def poll_timeout(self, now: float) -> float:
        """How long the next poll may wait for a first record: no longer than ops already
        read must wait for the spacing to pass."""
        if self.ops and self.when_caught_up:
            return max(0.0, min(self.poll_timeout_s, self.last_transaction + self.spacing - now))
        return self.poll_timeout_s

    def polled(self, records: int, ops: int) -> None:
        """A poll brought ``records`` records, ``ops`` of them op records."""
        self.read += records
        self.ops += ops
        self.caught_up = records < self.batch_max

    def due(self, now: float) -> bool:
        """Whether to commit now."""
        if self.read >= self.batch_max or now - self.last >= self.interval:
            return True
        return (
            self.when_caught_up
            and self.caught_up
            and self.ops > 0
            and now - self.last_transaction >= self.spacing
        )

    def committed(self, now: float, *, transaction: bool) -> None:
        """A commit was made at ``now``; ``transaction`` if it wrote a Kafka transaction (not
        when nothing had moved)."""
        self.last = now
        self.read = self.ops = 0
        if transaction:
            self.last_transaction = now
