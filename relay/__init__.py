"""The relay service: promotes committed half messages to their real topics."""

from __future__ import annotations

from relay.relay import Relay
from relay.settings import RelaySettings

__all__ = ["Relay", "RelaySettings"]
