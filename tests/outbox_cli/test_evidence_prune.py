"""``kafka-outbox evidence prune`` on real databases."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from tests.outbox.test_pruning import NOW, committed_at, horizon_reset  # noqa: F401
from tests.outbox_cli.conftest import Cli
from tests.producer_fixtures import evidence_ids

pytestmark = pytest.mark.integration


def test_the_prune_command_deletes_old_rows_and_refuses_a_short_retention(
    cli: Cli, engine: sa.Engine, db_url: str
) -> None:
    old = committed_at(engine, NOW - dt.timedelta(days=30))
    young = committed_at(engine, NOW - dt.timedelta(hours=1))
    done = cli("evidence", "prune", "--db-url", db_url, "--older-than", "14d")
    assert done.code == 0, done.err
    assert "evidence rows created before" in done.out
    assert old not in evidence_ids(engine) and young in evidence_ids(engine)
    short = cli("evidence", "prune", "--db-url", db_url, "--older-than", "1h")
    assert short.code == 2 and "shorter than 1 day" in short.err
