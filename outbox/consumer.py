"""Dropping repeated promoted records on the consumer side.

A ``read_committed`` consumer of a real topic sees each committed message once: the relay writes
promotions in Kafka transactions. Two kinds of consumers still see repeats and want this:

* consumers that cannot read with ``isolation.level=read_committed`` (some clients, some
  connectors): they also see the records of relay batches that were aborted and redone;
* consumers that process at least once: they commit their offsets after acting, so a crash
  between acting and committing replays the records since the last commit — when the action
  goes to another system (a database, an e-mail, an HTTP call), the repeat must be dropped
  there, or the action made idempotent.

Every promoted record carries ``outbox-txn-id`` and ``outbox-message-index``; this helper
remembers the last ``window`` of those pairs and tells a repeat from a first delivery. Size the
window to cover what can be replayed: at least the records between two offset commits, and
for read_uncommitted consumers the records of a few relay batches (``batch_max_records``).
For repeats across restarts, keep the pairs in your own store (e.g. a unique key in the table
the consumer writes to) — this class lives in memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from outbox.errors import ConfigurationError
from outbox.protocol.headers import Header

HeadersLike = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None


class Deduplicator:
    """Remembers the last ``window`` promoted messages seen.

    ::

        dedup = Deduplicator(window=100_000)
        for msg in consume_ready(consumer, 500, 1.0):  # outbox.reading
            if dedup.first_time(msg.headers()):
                handle(msg)
    """

    def __init__(self, window: int = 100_000) -> None:
        if window < 1:
            raise ConfigurationError(f"window={window!r} must be at least 1")
        self.window = window
        self.repeats = 0
        self._seen: OrderedDict[tuple[bytes, bytes], None] = OrderedDict()

    def first_time(self, headers: HeadersLike) -> bool:
        """True the first time a message is seen (and for records not written by the relay)."""
        key = message_id(headers)
        if key is None:
            return True
        if key in self._seen:
            self._seen.move_to_end(key)
            self.repeats += 1
            return False
        self._seen[key] = None
        if len(self._seen) > self.window:
            self._seen.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._seen)


def message_id(headers: HeadersLike) -> tuple[bytes, bytes] | None:
    """(transaction id, message index) of a promoted record, or None for other records."""
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
    txn = index = None
    for name, value in pairs:
        if name == Header.TXN_ID:
            txn = value
        elif name == Header.MESSAGE_INDEX:
            index = value
    if txn is None or index is None:
        return None
    as_bytes = [v.encode() if isinstance(v, str) else v for v in (txn, index)]
    return (as_bytes[0], as_bytes[1])
