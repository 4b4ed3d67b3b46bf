"""A token in the progress each Kafka transaction commits, unique to that transaction.

An instance given back a partition it let go at the revoke just before keeps its state if the
committed progress is still the one it committed (:meth:`relay.rebalance.Rebalance.kept`). The
offsets and the rebuild point alone cannot show that nobody else committed meanwhile: a member
that held the partition in a generation this instance missed (revoked, then left out of the
group while it was slow to rejoin, with no callback in between) may have promoted a parked
transaction, or put one back, while an older pending transaction kept both offsets where they
were. Kept, the stale state would promote that transaction again. So each Kafka transaction
stamps the op offset's metadata of every partition it commits with a token of its own - a
random nonce of the process and a sequence number - and any other member's commit differs.

The token is the document's last member (``...,"t":"<nonce>.<n>"}``); readers of the progress
ignore it (:meth:`relay.progress.Progress.parse` reads the keys it knows), and the batch compares
progress without it, so a partition whose progress did not move is still not committed again.
"""

from __future__ import annotations

import itertools
import secrets

_KEY = ',"t":"'


class CommitTokens:
    """One token per Kafka transaction of this process."""

    def __init__(self, nonce: str | None = None) -> None:
        self.nonce = nonce or secrets.token_hex(6)
        self._sequence = itertools.count(1)

    def next(self) -> str:
        return f"{self.nonce}.{next(self._sequence)}"


def stamped(metadata: str, token: str) -> str:
    """``metadata`` (a JSON object, :meth:`relay.progress.Progress.metadata`) with ``token`` as
    its last member."""
    return f'{metadata[:-1]}{_KEY}{token}"}}'


def unstamped(metadata: str) -> str:
    """``metadata`` without the token :func:`stamped` added (as it is if it has none)."""
    at = metadata.rfind(_KEY)
    return metadata if at < 0 else metadata[:at] + "}"


def stamped_by_a_commit(metadata: str) -> bool:
    """Whether ``metadata`` carries a token (committed by a relay that stamps its progress)."""
    return _KEY in metadata
