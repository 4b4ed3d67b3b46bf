"""Evidence DB URLs: JDBC as given, PostgreSQL SQLAlchemy URLs translated, others refused."""

from __future__ import annotations

import pytest

from checker.audit.errors import AuditConfigError
from checker.audit.evidence_source import is_sqlite, jdbc_target


def test_a_jdbc_url_is_used_as_it_is_with_the_given_credentials() -> None:
    url, props = jdbc_target("jdbc:postgresql://db:5432/orders", "audit", "pw")
    assert url == "jdbc:postgresql://db:5432/orders"
    assert props == {"user": "audit", "password": "pw", "driver": "org.postgresql.Driver"}


def test_a_producers_sqlalchemy_url_becomes_a_jdbc_url() -> None:
    url, props = jdbc_target("postgresql+psycopg://app:secret@db:5433/orders?sslmode=require")
    assert url == "jdbc:postgresql://db:5433/orders?sslmode=require"
    assert props == {"driver": "org.postgresql.Driver", "user": "app", "password": "secret"}


def test_explicit_credentials_win_over_the_urls() -> None:
    _, props = jdbc_target("postgresql://app:secret@db/orders", "audit", "pw")
    assert (props["user"], props["password"]) == ("audit", "pw")


@pytest.mark.parametrize("url", ["mysql+pymysql://u@h/db", "not a url"])
def test_other_databases_need_a_jdbc_url(url: str) -> None:
    with pytest.raises(AuditConfigError):
        jdbc_target(url)


def test_sqlite_urls_are_read_on_the_driver() -> None:
    assert is_sqlite("sqlite:///tmp/x.db")
    assert not is_sqlite("postgresql://h/db")
