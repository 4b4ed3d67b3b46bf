"""``python -m outbox_cli``: the same as the ``kafka-outbox`` console script."""

from __future__ import annotations

from outbox_cli.main import run

run()
