"""docs/relay.md names every relay setting and metric: the document matches the code."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from relay import Relay, RelaySettings

DOC = (Path(__file__).parents[2] / "docs" / "relay.md").read_text()


@pytest.mark.parametrize("name", [f.name for f in fields(RelaySettings) if f.name != "kafka"])
def test_every_relay_setting_is_documented(name: str) -> None:
    assert f"`{name}`" in DOC


def test_every_relay_metric_is_documented() -> None:
    relay = Relay(RelaySettings(bootstrap_servers="unused:9092"))
    names = set(re.findall(r"^# TYPE (\S+)", relay.metrics.render().decode(), re.M))
    assert names, "no metrics rendered"
    for name in names - {n for n in names if n.endswith("_created")}:  # prometheus-client's own
        base = name.removesuffix("_total")
        assert f"`{base}" in DOC, name
