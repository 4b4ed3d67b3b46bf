"""The findings: pure functions from DataFrames to the DataFrame of one kind of violation.

Each row carries what an operator needs to act: the transaction id, its producer group, where
its records are (topic, partition, offsets), the broker timestamps (``*_ms``, Unix ms) and the
states. Jepsen's Kafka checker is the model: lost writes, duplicates, aborted reads (here
*phantom*), non-monotonic reads (here *out of order*).
"""

from __future__ import annotations

#: Every finding, in report order, with what it means. Any row of any of them is a violation.
FINDINGS: dict[str, str] = {
    "lost": "COMMIT decided, but none of the transaction's messages is on its real topic "
    "after the grace period.",
    "partial": "COMMIT decided, but only some of the transaction's messages are on their real "
    "topics after the grace period (all-or-nothing broken).",
    "phantom": "A record on a real topic whose transaction has no COMMIT: rolled back, given "
    "up, undecided, unknown to the half and op topics, or an index past the committed count.",
    "duplicate": "The same (transaction id, message index) more than once on the real topics.",
    "out_of_order": "For one key, a record promoted after one whose COMMIT op came later (or, "
    "within a transaction, after a higher message index).",
    "stuck": "Half records with no decision for longer than the full check window.",
    "given_up": "The checker gave up (GIVEN_UP op): the messages are on the dead-letter topic "
    "and the local transaction's outcome is not reflected in messaging.",
    "conflicting_decisions": "Two different terminal ops for one transaction (the first wins), "
    "or a RESUMED after a COMMIT or ROLLBACK.",
    "evidence_without_commit": "The producer's database holds commit evidence, but the "
    "transaction was rolled back, given up, or left undecided past the check window.",
    "commit_without_evidence": "A COMMIT op for a transaction the producer's database has no "
    "commit evidence for (no row, or a fence row); transactions the listener answers, and "
    "those begun before the table's pruning horizon with no row, are not judged.",
    "unreadable": "Records in range the audit cannot read the way docs/protocol.md says "
    "(unknown schema version, missing or malformed field): upgrade the audit or fix the writer.",
}
