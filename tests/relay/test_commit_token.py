"""``relay.commit_token``: each Kafka transaction's progress carries a token of its own, which
readers of the progress ignore and the batch's "unchanged" comparison leaves out. The case it
exists for is ``tests/relay/test_missed_generation.py``."""

from __future__ import annotations

import json

from relay.commit_token import CommitTokens, stamped, stamped_by_a_commit, unstamped
from relay.progress import Progress


def test_every_commit_of_every_process_has_its_own_token() -> None:
    one, other = CommitTokens(), CommitTokens()
    tokens = [one.next() for _ in range(1000)] + [other.next() for _ in range(1000)]
    assert len(set(tokens)) == 2000
    assert one.nonce != other.nonce


def test_a_stamped_progress_reads_as_the_progress_and_unstamps_to_it() -> None:
    for progress in (Progress(5, 9, 3), Progress(5, 9, 3, gap=(0, 5))):
        metadata = progress.metadata()
        token = CommitTokens("ab12cd34ef56").next()
        sent = stamped(metadata, token)
        assert json.loads(sent)["t"] == token  # still one JSON document
        assert Progress.parse(5, 9, sent) == Progress.parse(5, 9, metadata) == progress
        assert unstamped(sent) == metadata
        assert unstamped(metadata) == metadata  # an older relay's, or the first commit's
        assert stamped_by_a_commit(sent) and not stamped_by_a_commit(metadata)
        # far under the broker's offset.metadata.max.bytes (4096 by default)
        assert len(stamped(Progress(2**62, 2**62, 2**62, (2**62, 2**62)).metadata(), token)) < 200
