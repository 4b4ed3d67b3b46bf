"""docs/protocol.md names every constant of outbox.protocol: the document matches the code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from outbox.protocol import (
    HALF_FIELDS,
    HALF_SCHEMA_VERSION,
    SCHEMA_VERSION,
    DecidedBy,
    Header,
    OpRecord,
    OpState,
    TopicNames,
    decode_half,
    encode_op,
    topic_settings,
)

DOC = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()


@pytest.mark.parametrize("header", list(Header), ids=lambda h: h.value)
def test_every_header_is_documented(header: Header) -> None:
    assert f"`{header.value}`" in DOC


@pytest.mark.parametrize("state", [*OpState, *DecidedBy], ids=str)
def test_every_op_state_and_decider_is_documented(state: OpState | DecidedBy) -> None:
    assert f"`{state.value}`" in DOC


def test_schema_version_is_the_documented_one() -> None:
    assert f"schema version {SCHEMA_VERSION}" in DOC
    assert f'"v": {SCHEMA_VERSION}' in DOC


def test_every_half_field_is_documented_and_the_example_reads_as_written() -> None:
    assert f"half records: schema version {HALF_SCHEMA_VERSION}" in DOC
    for number, name in enumerate(HALF_FIELDS, start=1):
        assert f"| {number} | `{name}` |" in DOC, name
    example = re.search(r"Example \(`␟` is the byte `0x1f`\): `([^`]+)`", DOC)
    assert example is not None
    packed = example.group(1).replace("␟", "\x1f").encode()
    record = decode_half(value=b"v", headers=[("outbox-half", packed)])
    assert (record.schema_version, record.producer_group, record.message.topic) == (
        2,
        "orders",
        "orders-events",
    )
    assert (record.index, record.check_count, record.count, record.check_immunity_s) == (
        0,
        0,
        1,
        None,
    )


def test_every_topic_and_its_settings_are_documented() -> None:
    names = TopicNames("{prefix}")
    for topic in names.all():
        assert f"`{topic}`" in DOC
        for key, value in topic_settings(names, topic).items():
            if key != "min.compaction.lag.ms":
                assert f"`{key}={value}`" in DOC, (topic, key)


def test_every_op_document_field_is_documented() -> None:
    op = OpRecord(
        txn_id="01a203d8-301f-7701-b6f4-468c06c700b2",
        state=OpState.COMMIT,
        producer_group="g",
        half_partition=0,
        half_offsets=(1,),
        decided_by=DecidedBy.PRODUCER,
        decided_at_ms=0,
        reason="r",
    )
    document = json.loads(encode_op(op)[1])
    fields = [k for k in document if k != "half"] + [f"half.{k}" for k in document["half"]]
    for name in fields:
        assert f"`{name}`" in DOC, name
