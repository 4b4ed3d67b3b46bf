"""Building the frozen records the decoders hand out, at the cost of a plain object.

A frozen dataclass's generated ``__init__`` sets each field through ``object.__setattr__`` to get
past its own ``__setattr__``: 2.3 us for a :class:`~outbox.protocol.half.HalfRecord` (13 fields)
and 1.1 us for its :class:`~outbox.protocol.half.HalfMessage`, against 0.3 us for filling the
instance's ``__dict__`` (CPython 3.11). The relay decodes every half and op record it reads, so
that was ~5% of its CPU. The result is the same instance the constructor would build: equal,
hashed and pickled alike, and still frozen to its users.
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")

_new = object.__new__


def frozen(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of the frozen dataclass ``cls`` holding ``fields``, already validated.

    ``fields`` must name every field: one left out would read as the class's default (or raise
    AttributeError where there is none), which the decoders' tests rule out by comparing with
    what the constructor builds.
    """
    instance = _new(cls)
    instance.__dict__.update(fields)
    return instance
