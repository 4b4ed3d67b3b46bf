"""The partition pairs this instance holds now: each one's state, and the progress it last
committed for each (or read as committed on assignment).

Shared by the parts of the relay that read or change them: the rebalance fills and empties it,
the loop routes records into its states, a Kafka transaction commits their batches, the
accounting measures lag from it and ``/metrics`` reads it from the HTTP thread. Each of those
replaces ``states`` whole or changes one key, so the HTTP thread's copy is always consistent.
"""

from __future__ import annotations

from relay.state import PartitionState

#: What a committed Kafka transaction wrote for a partition pair: (half offset, op offset, the
#: op offset's metadata), compared as it is with the next batch's to skip unchanged partitions.
Committed = tuple[int, int, str]


class Partitions:
    """Partition number -> its state, and what this instance committed for it."""

    def __init__(self) -> None:
        self.states: dict[int, PartitionState] = {}
        self.committed: dict[int, Committed] = {}
        #: (half partitions, op partitions) of the last assignment, as the group gave them.
        self.assigned: tuple[frozenset[int], frozenset[int]] = (frozenset(), frozenset())

    def clear(self) -> None:
        """The session ended: nothing is held any more (the next one rebuilds)."""
        self.states = {}
        self.committed = {}
