"""Registry records: which producer instances of a group are alive and where to check them.

Key = ``{group}/{instance_id}``. Value = a JSON document (below), or null (a tombstone: the
instance shut down cleanly). The topic is compacted and stamped with the broker's clock, so an
instance is live while its latest heartbeat is younger than the checker's TTL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from outbox.errors import ProtocolError, UnknownSchemaVersionError
from outbox.protocol.headers import SCHEMA_VERSION


@dataclass(frozen=True)
class Registration:
    group: str
    instance_id: str
    check_url: str
    version: str

    @property
    def key(self) -> bytes:
        return f"{self.group}/{self.instance_id}".encode()


def encode_registration(reg: Registration) -> tuple[bytes, bytes]:
    document = {
        "v": SCHEMA_VERSION,
        "group": reg.group,
        "instance_id": reg.instance_id,
        "check_url": reg.check_url,
        "version": reg.version,
    }
    return reg.key, json.dumps(document, separators=(",", ":")).encode()


def decode_registration(value: bytes | None) -> Registration | None:
    """None for a tombstone.

    Raises:
        ProtocolError / UnknownSchemaVersionError: not a registration we can read.
    """
    if value is None:
        return None
    try:
        doc = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProtocolError(f"registry record is not JSON: {err}") from err
    if not isinstance(doc, dict) or doc.get("v") != SCHEMA_VERSION:
        raise UnknownSchemaVersionError(f"registry record has schema version {doc!r:.80}")
    try:
        return Registration(
            str(doc["group"]), str(doc["instance_id"]), str(doc["check_url"]), str(doc["version"])
        )
    except KeyError as err:
        raise ProtocolError(f"registry record lacks {err}") from err
