"""Kafka settings refused for good, told from librdkafka's errors, so that a relay or checker
ends with the setting named instead of trying again for ever.

**Refused by librdkafka.** librdkafka refuses to make a client of settings it rejects (an unknown
key, a value that does not parse, a ``session.timeout.ms`` above ``max.poll.interval.ms``): a
``KafkaException`` with ``_INVALID_ARG``. A service makes most of its clients anew for each
session, and took that for a failed session: it started a new one every second, for ever (the
relay's admin client, made once, crashed it with a traceback instead).
:func:`refusing_client_settings` turns it into a :class:`~outbox.errors.ConfigurationError`
where the clients are made. Not a file an ``ssl.`` setting names (a certificate, a key, a
keystore) that librdkafka could not read or decode as it made the client: a file being rotated
may be whole at the next try, so that is tried again, as before (each session's end logs why).

**Refused by the brokers.** A relay or checker is a member of a consumer group. The group's
coordinator refuses to let a member join whose ``session.timeout.ms`` lies outside the brokers'
``group.min.session.timeout.ms`` .. ``group.max.session.timeout.ms`` (6 s .. 30 min by
default): such a member holds no partition, so nothing is promoted or checked. librdkafka
reports it as a consumer error and asks again every few seconds, for ever. Measured with 3 s
against a default broker: over 40 s the relay logged "consumer error: JoinGroup failed: Broker:
Invalid session timeout" every 2 s and the checker nothing at all, each still running, neither
ever joining. No new session passes it, only another setting (or, while the brokers' range is
being changed in a rolling restart, a restart once they agree), so
:meth:`RefusedSettings.error_for` turns it into a :class:`~outbox.errors.ConfigurationError`.

Either way the service's ``python -m`` and ``kafka-outbox`` commands exit 2, as for any invalid
setting.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from outbox.env import kafka_setting_source
from outbox.errors import ConfigurationError

#: librdkafka's default, named if a consumer's settings set none (the services' set 10 s).
LIBRDKAFKA_SESSION_TIMEOUT_MS = 45000

#: How librdkafka says it could not read or decode a file an ``ssl.`` setting names, as it
#: makes the client: ``ssl.ca.location failed: ...``, ``Failed to open ssl.keystore.location:
#: ...``, ``Error reading ssl.keystore.location PKCS#12 file`` (src/rdkafka_ssl.c).
_FILE_FAILED = re.compile(
    r"ssl\.\S*location failed|failed to open ssl\.\S*location|error reading ssl\.\S*location",
    re.IGNORECASE,
)

#: How librdkafka names the property it refuses: ``No such configuration property: "foo.bar"``,
#: ``Invalid value for configuration property "session.timeout.ms"``.
_PROPERTY = re.compile(r'property:? "([^"]+)"')


@contextmanager
def refusing_client_settings(env_prefix: str) -> Iterator[None]:
    """Inside, librdkafka refusing to make a client of the settings given raises
    :class:`~outbox.errors.ConfigurationError` naming what it refused; other errors pass.

    Its context is librdkafka's error, and that error's traceback holds what the block made
    before it: a service raises its own again as text (``Relay``, ``Checker``).
    """
    try:
        yield
    except KafkaException as err:
        error = err.args[0] if err.args else None
        if not isinstance(error, KafkaError) or error.code() != KafkaError._INVALID_ARG:
            raise
        text = error.str()
        if _FILE_FAILED.search(text):
            raise  # a file it names (a certificate, a key) may be readable at the next try
        named = _PROPERTY.search(text)
        fix = (
            f"fix or remove {kafka_setting_source(env_prefix, named.group(1))}"
            if named
            else f"fix the settings it names ({env_prefix}KAFKA__<KEY>, '_' for '.', or the "
            "config file's or the settings' kafka)"
        )
        raise ConfigurationError(f"librdkafka refuses the kafka settings: {text}; {fix}") from None


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
            f"the brokers refuse this consumer's session.timeout.ms ({self.session_timeout_ms} "
            f"ms): {error.str()}. It must lie within the brokers' group.min.session.timeout.ms "
            "and group.max.session.timeout.ms (6000 and 1800000 ms unless changed there), and "
            "not above the consumer's max.poll.interval.ms (300000 ms unless set): set "
            f"{kafka_setting_source(self.env_prefix, 'session.timeout.ms')} within them, or "
            "change the brokers' range; the group never lets this member join, so nothing would "
            "be read"
        )
