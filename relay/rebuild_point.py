"""The rebuild point: the op offset from which a rebuild of a partition's state must re-learn
decisions, kept as decisions are made while copies of them may lie ahead of the half reader.

A relay put back (re-appended) copies of long-pending transactions; a restart forgets which. A
transaction decided while the reader is below the half partition's end as known then may have
copies between the reader and that end, so until the reader passes that end, a rebuild must
re-learn decisions from that op on to tell those copies from pending work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator


class RebuildPoint:
    """(op offset, half end then) of decisions whose copies may lie ahead of the reader, oldest
    first; each bound ends once the reader passes its half end."""

    def __init__(self) -> None:
        self._ahead: deque[tuple[int, int]] = deque()

    def open(self, op_offset: int, half_end: int) -> None:
        """Decisions from ``op_offset`` on stay needed until the reader passes ``half_end`` (a
        rebuild carries over the committed rebuild point this way)."""
        self._ahead.append((op_offset, half_end))

    def bound(self, op_offset: int, half_position: int, log_end: int) -> None:
        """A transaction was decided at ``op_offset``: copies of it may still lie ahead of the
        reader (at ``half_position``), up to the half partition's end as known now."""
        if half_position >= log_end:
            return
        if self._ahead and self._ahead[-1][1] >= log_end:
            return  # an earlier op bounds it already, for at least as long
        self._ahead.append((op_offset, log_end))

    def passed(self, half_position: int) -> None:
        """The reader reached ``half_position``: bounds whose end it passed are over."""
        while self._ahead and half_position >= self._ahead[0][1]:
            self._ahead.popleft()

    def floor(self, op_position: int) -> int:
        """The op offset a rebuild would have to start from if the state were rebuilt now.

        A record read while an earlier bound is still open (the reader has not reached the
        end it names) may have been read, in an earlier life of this state, when decisions
        from that bound on were not yet made; it inherits the bound.
        """
        return min(op_position, self._ahead[0][0]) if self._ahead else op_position

    def bounds(self) -> Iterator[int]:
        """The op offsets of the open bounds."""
        return (offset for offset, _ in self._ahead)
