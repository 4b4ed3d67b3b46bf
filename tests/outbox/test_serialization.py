"""Serializers: one-argument callables as before, and confluent-kafka's ``serializer(obj, ctx)``
protocol with a context naming the REAL topic and the field (no services: what ``send()`` builds
is checked before it would be sent)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from confluent_kafka.serialization import (
    MessageField,
    SerializationContext,
    StringSerializer,
)

import outbox
from outbox import OutboxSettings
from outbox.protocol.half import HalfMessage
from outbox.serialization import takes_context, to_bytes
from outbox.testing.ports import free_port
from outbox.transaction import OutboxTransaction

SETTINGS = OutboxSettings(bootstrap_servers="127.0.0.1:1", producer_group="orders")


def build(
    *, producer_serializer: Any = None, producer_key_serializer: Any = None, **send: Any
) -> HalfMessage:
    """What ``outbox.send(**send)`` would send, from a transaction of a producer with these
    defaults (``OutboxTransaction.build`` is the step ``send()`` runs before sending)."""
    host = SimpleNamespace(
        settings=SETTINGS,
        serializer=producer_serializer,
        key_serializer=producer_key_serializer,
    )
    txn = OutboxTransaction(host)  # type: ignore[arg-type]
    args: dict[str, Any] = {"topic": "orders", "value": b"v"} | send
    return txn.build(**args)


@dataclass
class Recording:
    """A context serializer in confluent-kafka's shape that remembers what it was called with."""

    tag: bytes
    calls: list[tuple[Any, SerializationContext]]

    def __call__(self, obj: Any, ctx: SerializationContext) -> bytes:
        self.calls.append((obj, ctx))
        return self.tag + json.dumps(obj).encode()


def recording(tag: bytes = b"") -> Recording:
    return Recording(tag, [])


# -- which protocol -------------------------------------------------------------------------------


def one_arg(obj: Any) -> bytes:
    return repr(obj).encode()


def two_required(obj: Any, ctx: Any) -> bytes:
    return b""


def annotated_optional(obj: Any, ctx: SerializationContext | None = None) -> bytes:
    return b""


def optional_second(obj: Any, flags: int = 0) -> bytes:
    return b""


def star_args(*args: Any) -> bytes:
    return b""


class ValueOnly:
    def __call__(self, obj: Any) -> bytes:
        return b""


PROTOCOLS: list[tuple[str, object, bool]] = [
    ("outbox.json_serializer", outbox.json_serializer, False),
    ("a one-argument function", one_arg, False),
    ("a one-argument lambda", lambda obj: b"", False),
    ("json.dumps (keyword-only options)", json.dumps, False),
    ("orjson.dumps(obj, default=None)", orjson.dumps, False),
    ("pickle.dumps(obj, protocol=None)", pickle.dumps, False),
    ("a second parameter with a default", optional_second, False),
    ("*args", star_args, False),
    ("an object whose __call__ takes the value", ValueOnly(), False),
    ("a confluent Serializer", StringSerializer(), True),
    ("two required parameters", two_required, True),
    ("a two-argument lambda", lambda obj, ctx: b"", True),
    ("a second parameter annotated SerializationContext", annotated_optional, True),
    ("an object whose __call__ takes a context", recording(), True),
]


@pytest.mark.parametrize(
    ("case", "serializer", "context"), PROTOCOLS, ids=[case for case, _, _ in PROTOCOLS]
)
def test_a_serializer_takes_a_context_by_the_documented_rule(
    case: str, serializer: object, context: bool
) -> None:
    assert takes_context(serializer) is context


# -- one-argument serializers, as before ----------------------------------------------------------


def test_a_one_argument_serializer_serializes_value_and_key_and_str_passes_untouched() -> None:
    message = build(value={"id": 1}, key=7, serializer=outbox.json_serializer)
    assert message.value == b'{"id":1}'
    assert message.key == b"7"  # the value's one-argument serializer serializes keys too
    assert build(value="text", serializer=outbox.json_serializer).value == b"text"
    assert build(value={"a": 1}, producer_serializer=outbox.json_serializer).value == b'{"a":1}'


# -- context serializers --------------------------------------------------------------------------


def test_a_context_serializer_gets_the_real_topic_and_the_value_field() -> None:
    serializer = recording()
    message = build(topic="orders", value={"id": 1}, serializer=serializer)
    [(obj, ctx)] = serializer.calls
    assert obj == {"id": 1}
    assert isinstance(ctx, SerializationContext)
    assert ctx.topic == "orders" and ctx.topic != SETTINGS.topics.half
    assert ctx.field is MessageField.VALUE
    assert message.topic == "orders" and message.value == b'{"id": 1}'


def test_a_key_serializer_gets_the_key_field_and_a_context_value_serializer_is_not_reused() -> None:
    values, keys = recording(b"v:"), recording(b"k:")
    message = build(value={"id": 1}, key={"k": 1}, serializer=values, key_serializer=keys)
    assert [ctx.field for _, ctx in keys.calls] == [MessageField.KEY]
    assert [ctx.topic for _, ctx in keys.calls] == ["orders"]
    assert [ctx.field for _, ctx in values.calls] == [MessageField.VALUE]
    assert (message.key, message.value) == (b'k:{"k": 1}', b'v:{"id": 1}')
    # without key_serializer a str key is UTF-8 and the value's context serializer never sees it
    only_values = recording()
    assert build(value={}, key="order-1", serializer=only_values).key == b"order-1"
    assert [ctx.field for _, ctx in only_values.calls] == [MessageField.VALUE]


def test_the_producers_key_serializer_is_the_default() -> None:
    keys = recording(b"k:")
    assert build(key=5, producer_key_serializer=keys).key == b"k:5"
    assert [ctx.field for _, ctx in keys.calls] == [MessageField.KEY]


def test_a_context_serializer_frames_str_and_bytes_too_but_never_none() -> None:
    serializer = recording(b"framed:")
    assert build(value="text", serializer=serializer).value == b'framed:"text"'
    assert build(value=None, serializer=serializer).value is None
    assert [obj for obj, _ in serializer.calls] == ["text"]


def test_headers_are_in_the_context_and_headers_a_serializer_adds_are_sent() -> None:
    def with_schema_id(obj: Any, ctx: SerializationContext) -> bytes:
        assert ctx.headers == [("trace", b"t1")]  # the message's headers, as bytes
        assert isinstance(ctx.headers, list)
        ctx.headers.append(("__value_schema_id", b"\x01"))
        return b"x"

    message = build(value={}, headers={"trace": "t1"}, serializer=with_schema_id)
    assert message.headers == (("trace", b"t1"), ("__value_schema_id", b"\x01"))


def test_a_header_a_serializer_adds_under_the_reserved_prefix_is_refused() -> None:
    def bad(obj: Any, ctx: SerializationContext) -> bytes:
        assert isinstance(ctx.headers, list)
        ctx.headers.append(("outbox-real-topic", b"elsewhere"))
        return b"x"

    with pytest.raises(outbox.InvalidHeaderError, match="outbox-real-topic"):
        build(value={}, serializer=bad)


# -- errors ---------------------------------------------------------------------------------------


def test_a_key_of_another_type_with_only_a_context_value_serializer_names_key_serializer() -> None:
    with pytest.raises(outbox.SerializationError, match=r"key of type int .*key_serializer="):
        build(value={}, key=7, serializer=recording())


def test_a_failing_context_serializer_names_the_field_the_topic_and_the_cause() -> None:
    def failing(obj: Any, ctx: SerializationContext) -> bytes:
        raise ValueError("no schema for this")

    with pytest.raises(outbox.SerializationError) as raised:
        build(topic="payments", value={"id": 1}, serializer=failing)
    text = str(raised.value)
    assert "failed on the value (dict) for topic 'payments'" in text
    assert "with a SerializationContext" in text and "no schema for this" in text
    assert isinstance(raised.value.__cause__, ValueError)
    assert isinstance(raised.value, outbox.OutboxError)


def test_an_asynchronous_serializer_is_refused_with_its_synchronous_form_named() -> None:
    async def asynchronous(obj: Any, ctx: SerializationContext) -> bytes:
        return b""

    with pytest.raises(outbox.SerializationError, match=r"asynchronous.*synchronous form"):
        build(value={}, serializer=asynchronous)


def test_a_context_serializer_that_returns_no_bytes_is_refused() -> None:
    with pytest.raises(outbox.SerializationError, match="returned str for the value"):
        build(value={}, serializer=lambda obj, ctx: "not bytes")


def test_outbox_works_without_the_schema_registry_extras() -> None:
    # A producer installs kafka-outbox alone: confluent_kafka.schema_registry's own needs
    # (authlib, httpx, fastavro, jsonschema) may be missing, and serializers still work.
    script = """
import sys
for name in ("confluent_kafka.schema_registry", "authlib", "httpx", "httpx2", "fastavro",
             "jsonschema", "cachetools"):
    sys.modules[name] = None  # importing it raises ImportError, as if not installed
import outbox
from confluent_kafka.serialization import StringSerializer
from tests.outbox.test_serialization import build
assert build(value={"a": 1}, serializer=outbox.json_serializer).value == b'{"a":1}'
assert build(value="x", serializer=StringSerializer()).value == b"x"
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stdout + done.stderr


def test_a_schema_registry_that_cannot_be_reached_fails_the_send_naming_the_cause() -> None:
    registry = pytest.importorskip("confluent_kafka.schema_registry")
    avro = pytest.importorskip("confluent_kafka.schema_registry.avro")
    client = registry.SchemaRegistryClient(
        {"url": f"http://127.0.0.1:{free_port()}", "max.retries": 0}
    )
    serializer = avro.AvroSerializer(client, '"string"')
    with pytest.raises(outbox.SerializationError, match=r"AvroSerializer failed .*'orders'.*regis"):
        build(value="order-1", serializer=serializer)


def test_a_serializer_called_the_wrong_way_points_to_the_rule() -> None:
    def needs_three(obj: Any, ctx: Any, extra: Any) -> bytes:
        return b""

    with pytest.raises(outbox.SerializationError, match=r"TypeError.*two required positional"):
        build(value={}, serializer=needs_three)


def test_which_protocol_a_serializer_follows_is_worked_out_once_not_per_message() -> None:
    """Asked for every key and value; reading a signature costs microseconds (a builtin without
    one, such as orjson.dumps, some 77 us): before, it was read up to three times a message."""
    import inspect

    class Counting:
        reads = 0

        @property
        def __signature__(self) -> inspect.Signature:
            Counting.reads += 1
            return inspect.signature(lambda obj: None)

        def __call__(self, obj: object) -> bytes:
            return repr(obj).encode()

    serializer = Counting()
    for n in range(100):
        assert to_bytes("value", n, serializer, topic="orders") == repr(n).encode()
    assert Counting.reads == 1
