"""The signal that ends a relay session: its Kafka clients cannot go on.

Raised where the clients fail - fenced, a fatal error, a Kafka transaction that failed, a read
position out of range, the assigned partitions that could not be taken - and caught by
:meth:`relay.Relay.run`, which starts a new session: new clients, a new producer epoch, every
partition's state rebuilt from the committed progress.
"""

from __future__ import annotations


class Restart(Exception):
    """Raised when the Kafka clients cannot go on (fenced, fatal error): start a new session."""
