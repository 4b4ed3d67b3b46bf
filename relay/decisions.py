"""The decisions a partition's state remembers, and for how long.

A repeated terminal op (the checker re-deciding after its op's delivery failed although the op
had landed, a producer's COMMIT after the checker's, an operator's resume) is recognised by
*position*, not by memory: the committed half offset never passes a record of a pending
transaction, so an op whose half records the reader has passed, for a transaction that is
neither pending nor on its way back as put-back copies, was decided before, however long ago
(:meth:`relay.state.PartitionState`'s op handling).

A decision is remembered only while a record of its transaction may still lie ahead of the
reader, so that such a record is not taken for a pending one: a put-back copy written before the
decision lies below the half partition's end as known then; after a rebuild, the records of
transactions decided since the rebuild point (the ops in [``rebuild_from``, op offset), re-learnt
by :func:`relay.rebuild.apply_history`) are read again up to the end the partition had. Once the
reader passes that end the decision is forgotten. So what is remembered is bounded by what the
reader lags behind, never by history: a relay that keeps up remembers nothing.
"""

from __future__ import annotations

from collections import deque

from outbox.protocol.states import TERMINAL_STATES, OpState


class Decisions(dict[str, OpState]):
    """Transaction id -> its first terminal state, each until the reader passes an offset.

    A mapping itself (not a wrapper around one): ``txn_id in decisions`` is asked for every
    half record read, and stays a dict lookup.
    """

    def __init__(self) -> None:
        super().__init__()
        self._until: deque[tuple[int, str]] = deque()

    def remember(self, txn_id: str, state: OpState, *, until: int) -> None:
        """``txn_id`` was decided ``state``; remembered until the reader reaches ``until``."""
        assert state in TERMINAL_STATES
        self.setdefault(txn_id, state)
        self._until.append((until, txn_id))

    def expire(self, position: int) -> None:
        """The reader is at ``position``: forget what no record ahead can need any more.

        Ends are appended in (nearly) increasing order; one out of order is forgotten a
        little later than it could be, never earlier.
        """
        until = self._until
        while until and until[0][0] <= position:
            _, txn_id = until.popleft()
            self.pop(txn_id, None)
