"""Turning what a caller passes to ``send()`` into a validated :class:`HalfMessage`.

Every check happens here, before anything is sent, so bad input never leaves a half record
behind: Kafka's topic-name rules, the internal prefix, the size limit, value/key/header types,
reserved header names, and delayed delivery (which transactional messages do not support, as in
RocketMQ).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from outbox.errors import (
    DelayNotSupportedError,
    InternalTopicError,
    InvalidHeaderError,
    InvalidTopicError,
    MessageTooLargeError,
    SerializationError,
)
from outbox.protocol.half import HalfMessage
from outbox.protocol.headers import RESERVED_HEADER_PREFIX
from outbox.protocol.topics import TopicNames
from outbox.serialization import HeaderList, key_serializer_for
from outbox.serialization import Serializer as Serializer  # lived here: re-exported
from outbox.serialization import to_bytes as to_bytes  # lived here: re-exported

Headers = Mapping[str, str | bytes] | Sequence[tuple[str, str | bytes]]

_TOPIC_CHARS = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_LENGTH = 249


@dataclass(frozen=True)
class Message:
    """A message as RocketMQ's API spells it: where it goes, what it says.

    ``properties`` (RocketMQ's user properties) are sent as headers after ``headers``.

    ``delay_level`` and ``deliver_at_ms`` exist only to be refused: transactional messages cannot
    be delayed (RocketMQ clears the delay level of a transactional message).
    """

    topic: str
    value: Any
    key: Any = None
    headers: Headers | None = None
    delay_level: int | None = None
    deliver_at_ms: int | None = None
    properties: dict[str, str] = field(default_factory=dict)


def message_headers(message: Message) -> Headers | None:
    """The headers a :class:`Message` is sent with: its ``headers``, then its ``properties``
    (RocketMQ's user properties travel as Kafka headers, values UTF-8)."""
    if not message.properties:
        return message.headers
    items = message.headers.items() if isinstance(message.headers, Mapping) else message.headers
    return [*(items or ()), *message.properties.items()]


@dataclass(frozen=True, kw_only=True)
class MessageView(Message):
    """A half message as a check hands it to ``check_local_transaction`` (RocketMQ 5's
    ``MessageView``; RocketMQ 4 passes the half ``MessageExt``).

    It is the first message the transaction sent, read back from the half topic: ``topic``,
    ``key``, ``value`` and ``headers`` are as sent (serialized: bytes), and the fields below say
    which transaction it belongs to. Look the business outcome up by them, e.g. the order id in
    the key, and answer UNKNOWN while the local transaction may still commit.

    Attributes:
        transaction_id: the transaction id (``TransactionSendResult.transaction_id``).
        producer_group: the group that sent it.
        message_index: its position in the transaction (0 for the first message).
        message_count: how many messages the transaction has, when known at send time.
        partition: the half topic partition it is in.
        offset: its offset there (RocketMQ's commit-log offset).
        born_timestamp_ms: when the producer sent it (the producer's clock).
        check_times: how many checks its producers answered before this one.
    """

    transaction_id: str
    producer_group: str
    message_index: int = 0
    message_count: int | None = None
    partition: int = -1
    offset: int = -1
    born_timestamp_ms: int = 0
    check_times: int = 0


def json_serializer(value: Any) -> bytes:
    """UTF-8 JSON, compact; a ready-made ``serializer=`` for dicts and lists."""
    return json.dumps(value, separators=(",", ":"), default=str).encode()


def is_legal_topic(name: str) -> bool:
    """Whether Kafka allows ``name`` as a topic name (what :func:`validate_topic` checks first,
    without raising: the audit asks it of names read from half records)."""
    return (
        0 < len(name) <= MAX_TOPIC_LENGTH
        and name not in (".", "..")
        and _TOPIC_CHARS.match(name) is not None
    )


def validate_topic(topic: object, names: TopicNames) -> str:
    """Kafka's rules for a topic name, plus: not one of ours.

    Raises:
        InvalidTopicError: not a legal Kafka topic name.
        InternalTopicError: under the outbox's internal prefix.
    """
    if type(topic) is str and (topic, names.prefix) in _valid_topics:
        return topic  # every send names a topic, most of them the same few
    if not isinstance(topic, str):
        raise InvalidTopicError(f"topic must be a str, got {type(topic).__name__}: {topic!r}")
    if topic in ("", ".", ".."):
        raise InvalidTopicError(f"topic {topic!r} is not a legal Kafka topic name")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(
            f"topic {topic[:40]!r}... is {len(topic)} characters; Kafka allows {MAX_TOPIC_LENGTH}"
        )
    if not _TOPIC_CHARS.match(topic):
        bad = sorted({c for c in topic if not _TOPIC_CHARS.match(c)})
        raise InvalidTopicError(
            f"topic {topic!r} contains {''.join(bad)!r}; Kafka allows only ASCII letters, "
            "digits, '.', '_' and '-'"
        )
    if names.is_internal(topic):
        raise InternalTopicError(
            f"topic {topic!r} is under the outbox's internal prefix {names.prefix!r}; "
            "send to your real topic - the outbox routes it through its internal topics itself"
        )
    if len(_valid_topics) >= MAX_VALID_TOPICS:
        _valid_topics.clear()  # bounded: a service that names topics by tenant starts over
    if type(topic) is str:  # a subclass's own __eq__ must not answer for plain topics later
        _valid_topics.add((topic, names.prefix))
    return topic


#: How many (topic, internal prefix) pairs :func:`validate_topic` remembers as valid.
MAX_VALID_TOPICS = 1024
_valid_topics: set[tuple[str, str]] = set()


def to_headers(headers: Headers | HeaderList | None) -> tuple[tuple[str, bytes], ...]:
    """Validated user headers as ``(name, bytes)`` pairs, order kept (also those a context
    serializer added to the list in its ``SerializationContext``).

    Raises:
        InvalidHeaderError: a name that is not a str, or that uses the reserved prefix.
        SerializationError: a value that is neither str nor bytes.
    """
    if headers is None:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    result = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidHeaderError(f"header {item!r} is not a (name, value) pair")
        name, value = item
        if not isinstance(name, str) or not name:
            raise InvalidHeaderError(f"header name {name!r} must be a non-empty str")
        if name.lower().startswith(RESERVED_HEADER_PREFIX):
            raise InvalidHeaderError(
                f"header {name!r} uses the prefix {RESERVED_HEADER_PREFIX!r} the outbox reserves "
                "for its own headers; rename it"
            )
        if isinstance(value, str):
            value = value.encode()
        if not isinstance(value, bytes):
            raise SerializationError(
                f"header {name!r} has a {type(value).__name__} value; header values must be "
                "str or bytes"
            )
        result.append((name, value))
    return tuple(result)


def build_half_message(
    *,
    topic: Any,
    value: Any,
    key: Any,
    headers: Headers | None,
    names: TopicNames,
    max_bytes: int,
    serializer: Serializer | None = None,
    key_serializer: Serializer | None = None,
    delay: Any = None,
) -> HalfMessage:
    """Validate and serialize one message; raise before anything is sent.

    The key is serialized before the value, as confluent-kafka's ``SerializingProducer`` does,
    both with the real topic in their context (:mod:`outbox.serialization`) and one header list,
    to which a serializer may add.
    """
    if delay is not None:
        raise DelayNotSupportedError(
            f"delayed or scheduled delivery ({delay!r}) is not supported for transactional "
            "messages (as in RocketMQ); send without a delay, or schedule the business action"
        )
    real_topic = validate_topic(topic, names)
    sent_headers: HeaderList = list(to_headers(headers))
    serialized_key = to_bytes(
        "key",
        key,
        key_serializer_for(key_serializer, serializer),
        topic=real_topic,
        headers=sent_headers,
    )
    message = HalfMessage(
        topic=real_topic,
        value=to_bytes("value", value, serializer, topic=real_topic, headers=sent_headers),
        key=serialized_key,
        headers=to_headers(sent_headers),
    )
    size = len(message.value or b"")
    if size > max_bytes:
        raise MessageTooLargeError(
            f"value of {size} bytes for topic {message.topic!r} is over the limit of {max_bytes} "
            "bytes; raise max_message_bytes (and the topics' max.message.bytes) or send less"
        )
    return message
