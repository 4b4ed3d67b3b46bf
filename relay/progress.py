"""The committed progress of one partition pair, and its codec.

The relay commits its progress in the same Kafka transaction as the records it wrote: the half
and op offsets with ``send_offsets_to_transaction``, and, as the op offset's commit metadata, a
document of constant size ``{"v":2,"l":<rebuild point>,"g":[<from>,<to>],"t":<token>}`` (``g``
only after half records were lost to retention unread; ``t`` unique to the Kafka transaction
that committed it, :mod:`relay.commit_token`, and ignored here). Commit metadata is bounded
by the broker's ``offset.metadata.max.bytes`` (4096 by default), so nothing whose size grows
with traffic is kept here: parked transactions are state records on the state topic
(:mod:`outbox.protocol.state`), written in the same Kafka transaction.

A restart or a rebalance reads the progress back (:mod:`relay.rebalance`) and rebuilds the
partition's state from it (:func:`relay.rebuild.rebuild`). Version 1 (``"parked": [ids]``, an
older relay's) is still read: its parked transactions are re-parked from the op history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: Progress metadata format version (stored with the committed op offset).
PROGRESS_VERSION = 2


@dataclass
class Progress:
    """Committed progress of one partition pair (what :func:`rebuild` starts from)."""

    half_offset: int = 0
    op_offset: int = 0
    rebuild_from: int = 0
    #: Half offsets [from, to) removed by retention before the relay read them: a COMMIT
    #: naming them is dead-lettered, not taken for a repeat.
    gap: tuple[int, int] | None = None
    #: Parked transaction ids from a version-1 document (an older relay's); re-parked from the
    #: op history. This relay keeps them on the state topic.
    legacy_parked: tuple[str, ...] = ()

    def metadata(self) -> str:
        doc: dict[str, object] = {"v": PROGRESS_VERSION, "l": self.rebuild_from}
        if self.gap is not None:
            doc["g"] = list(self.gap)
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def parse(cls, half_offset: int, op_offset: int, metadata: str | None) -> Progress:
        """Progress as committed; no or foreign metadata means "scan from the op offset"."""
        try:
            doc = json.loads(metadata or "")
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return cls(half_offset, op_offset, op_offset)
        if doc.get("v") == 1:
            return cls(
                half_offset, op_offset, int(doc["l"]), legacy_parked=tuple(doc.get("parked", ()))
            )
        if doc.get("v") != PROGRESS_VERSION:
            return cls(half_offset, op_offset, op_offset)
        gap = doc.get("g")
        return cls(
            half_offset,
            op_offset,
            int(doc["l"]),
            (int(gap[0]), int(gap[1])) if isinstance(gap, list) and len(gap) == 2 else None,
        )
