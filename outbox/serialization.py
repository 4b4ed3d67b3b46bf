"""Serializers for ``send()``: one-argument callables, or confluent-kafka's ``Serializer`` protocol.

confluent-kafka's schema-registry serializers (``AvroSerializer``, ``JSONSerializer``,
``ProtobufSerializer``) are called ``serializer(obj, SerializationContext(topic, field))`` and
register or look up their schema under a subject named after that topic and field (the default
``TopicNameStrategy``: ``orders-value``, ``orders-key``). A record of the outbox goes to the half
topic first, so the context given here names the REAL topic: the schema lands under the subject
a consumer of the real topic looks it up by, never under the half topic's.

Which protocol a serializer follows (:func:`takes_context`), in this order:

1. an instance of ``confluent_kafka.serialization.Serializer`` (every serializer confluent-kafka
   ships) takes a context;
2. so does a callable whose signature has exactly two required positional parameters
   (``def serialize(obj, ctx)``), or whose second positional parameter is annotated
   ``SerializationContext`` (``def serialize(obj, ctx: SerializationContext | None = None)``);
3. anything else is called with the object alone, as before this module existed.

"Takes two positional arguments" would not do: ``orjson.dumps(obj, default=None)`` and
``pickle.dumps(obj, protocol=None)`` take a second, optional one that is not a context.

The two kinds differ in what they are given. A one-argument serializer sees only what cannot be
sent as is (bytes and str pass untouched: the behaviour that predates contexts). A context
serializer, like confluent-kafka's ``SerializingProducer`` does, sees every value but None (a
tombstone stays None): a schema serializer must frame a str too. It also gets the message's
headers as a list in ``ctx.headers``; headers it appends (confluent's
``header_schema_id_serializer``) are sent with the message.

Serializing happens at ``send()``, before the half record is written: a schema serializer may
register its schema then, and a transaction that later rolls back leaves that schema registered,
which is harmless (registering is idempotent, and the schema is the one the next attempt uses).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from confluent_kafka.serialization import MessageField, SerializationContext
from confluent_kafka.serialization import Serializer as ConfluentSerializer

from outbox.errors import SerializationError

#: The headers as ``SerializationContext.headers`` carries them (confluent-kafka's list form).
HeaderList = list[tuple[str, str | bytes | None]]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class ContextSerializer(Protocol):
    """confluent-kafka's protocol: the object and where it goes (topic, field, headers)."""

    def __call__(self, obj: Any, ctx: SerializationContext, /) -> bytes | None: ...


#: A ``serializer=`` / ``key_serializer=``: ``Callable[[Any], bytes]`` or a context serializer.
Serializer = Callable[[Any], bytes] | ContextSerializer


def takes_context(serializer: object) -> bool:
    """Whether ``serializer`` is called ``serializer(obj, ctx)`` (the rule in the module doc).

    Asked for every key and value sent, so the answer is remembered per serializer: reading a
    signature costs some 7 us, and a builtin without one (``orjson.dumps``) some 77 us.
    """
    if isinstance(serializer, ConfluentSerializer):
        return True
    try:
        return _remembered(serializer)
    except TypeError:  # not hashable: worked out each time
        return _takes_context(serializer)


@functools.lru_cache(maxsize=256)
def _remembered(serializer: object) -> bool:
    return _takes_context(serializer)


def _takes_context(serializer: object) -> bool:
    try:
        parameters = inspect.signature(serializer).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin without a signature: the one-argument form
        return False
    positional = [p for p in parameters if p.kind in _POSITIONAL]
    required = [p for p in positional if p.default is inspect.Parameter.empty]
    if len(required) == 2 and positional[:2] == required:
        return True
    return len(positional) >= 2 and _names_context(positional[1].annotation)


def _names_context(annotation: object) -> bool:
    """An annotation mentioning ``SerializationContext``, evaluated or still a string (PEP 563)."""
    if annotation is inspect.Parameter.empty:
        return False
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return "SerializationContext" in text


def key_serializer_for(
    key_serializer: Serializer | None, serializer: Serializer | None
) -> Serializer | None:
    """The key's serializer: ``key_serializer``, else the value's if it takes no context.

    A one-argument ``serializer=`` has always serialized keys too; a context serializer is not
    reused for keys: its schema describes values, and registered under ``<topic>-key`` it would
    make a wrong subject. Keys of other types then need ``key_serializer=``.
    """
    if key_serializer is not None:
        return key_serializer
    if serializer is not None and not takes_context(serializer):
        return serializer
    return None


def to_bytes(
    what: str,
    value: Any,
    serializer: Serializer | None,
    *,
    topic: str = "",
    headers: HeaderList | None = None,
) -> bytes | None:
    """``value`` (the message's ``what``: "value" or "key") as the bytes to send.

    None passes; a context serializer gets every other value, with a context naming ``topic``
    (the real topic), the field and ``headers`` (which it may append to); otherwise bytes pass,
    str is UTF-8, and anything else goes through the one-argument ``serializer``.

    Raises:
        SerializationError: an unsupported type without a serializer, a serializer that failed
            or did not return bytes.
    """
    if value is None:
        return None
    if serializer is not None and takes_context(serializer):
        field = MessageField.KEY if what == "key" else MessageField.VALUE
        context = SerializationContext(topic, field, headers if headers is not None else [])
        return _checked(what, value, topic, "with a SerializationContext", serializer, context)
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if serializer is None:
        option = "key_serializer" if what == "key" else "serializer"
        raise SerializationError(
            f"{what} of type {type(value).__name__} for topic {topic!r} cannot be sent as is; "
            f"pass bytes or str, or a serializer (e.g. {option}=outbox.json_serializer)"
        )
    return _checked(what, value, topic, f"with the {what} alone", serializer)


def _checked(
    what: str, value: Any, topic: str, how: str, serializer: Callable[..., Any], *ctx: object
) -> bytes:
    """Call ``serializer`` and insist on bytes, naming the value and the fix when it fails."""
    name = getattr(serializer, "__qualname__", type(serializer).__qualname__)
    try:
        data = serializer(value, *ctx)
    except Exception as err:
        hint = (
            " (is it called the way it expects? A serializer gets a context when it is a "
            "confluent_kafka Serializer or has two required positional parameters: "
            "docs/serializers.md)"
            if isinstance(err, TypeError)
            else ""
        )
        raise SerializationError(
            f"the serializer {name} failed on the {what} ({type(value).__name__}) for topic "
            f"{topic!r}, called {how}: {err!r}; nothing was sent - check the {what} against "
            f"the serializer, and its schema registry if it uses one{hint}"
        ) from err
    if isinstance(data, Awaitable):
        close = getattr(data, "close", None)
        if callable(close):
            close()  # a coroutine never awaited would warn later, far from here
        raise SerializationError(
            f"the serializer {name} is asynchronous (it returned {type(data).__name__} for the "
            f"{what} for topic {topic!r}); send() serializes synchronously - use its synchronous "
            "form (e.g. AvroSerializer, not AsyncAvroSerializer)"
        )
    if not isinstance(data, bytes):
        raise SerializationError(
            f"the serializer {name} returned {type(data).__name__} for the {what} for topic "
            f"{topic!r}; it must return bytes"
        )
    return data
