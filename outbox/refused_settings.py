"""A consumer setting the broker refuses, told from the consumer's errors, so that a service
ends with the setting named instead of waiting for ever.

A relay or checker is a member of a consumer group. The group's coordinator refuses to let a
member join whose ``session.timeout.ms`` lies outside the broker's
``group.min.session.timeout.ms`` .. ``group.max.session.timeout.ms`` (6 s .. 30 min by default):
such a member holds no partition, so nothing is promoted or checked. librdkafka reports it as a
consumer error and asks again every few seconds, for ever. Measured with 3 s against a default
broker: over 40 s the relay logged "consumer error: JoinGroup failed: Broker: Invalid session
timeout" every 2 s and the checker nothing at all, each still running, neither ever joining. No
retry passes it, only another setting, so the service raises
:class:`~outbox.errors.ConfigurationError` (its ``python -m`` and ``kafka-outbox`` commands exit 2,
as for any invalid setting).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError

from outbox.errors import ConfigurationError

#: librdkafka's default, which a service's consumer keeps unless it or its settings set one.
LIBRDKAFKA_SESSION_TIMEOUT_MS = 45000


class RefusedSettings:
    """Tells which of a consumer's errors mean the broker refuses one of its settings.

    ``config``: the consumer's librdkafka settings; ``env_prefix``: its service's variables
    (``OUTBOX_RELAY_``), to name the one that sets the refused value.
    """

    def __init__(self, config: Mapping[str, Any], env_prefix: str) -> None:
        self.session_timeout_ms = config.get("session.timeout.ms", LIBRDKAFKA_SESSION_TIMEOUT_MS)
        self.env_prefix = env_prefix

    def error_for(self, error: KafkaError) -> ConfigurationError | None:
        """The error to end the service with, or None for an error a retry may pass."""
        if error.code() != KafkaError.INVALID_SESSION_TIMEOUT:
            return None
        return ConfigurationError(
            f"the broker refuses this consumer's session.timeout.ms ({self.session_timeout_ms} "
            f"ms): {error.str()}. It must lie within the brokers' group.min.session.timeout.ms "
            f"and group.max.session.timeout.ms (6000 and 1800000 ms unless changed there): set "
            f"{self.env_prefix}KAFKA__SESSION_TIMEOUT_MS (the kafka setting session.timeout.ms) "
            "within them, or change the brokers' range; the group never lets this member join, "
            "so nothing would be read"
        )
