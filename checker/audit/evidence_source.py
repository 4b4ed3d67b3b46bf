"""Reading the producers' evidence table: over JDBC into Spark, or SQLite on the driver.

``jdbc:postgresql://...`` URLs go to Spark's JDBC source as they are (the PostgreSQL driver is
among the cached jars); SQLAlchemy URLs of PostgreSQL (``postgresql+psycopg://u:p@h/db``, the
form the producers use) are translated. ``sqlite:///file`` is read on the driver through
SQLAlchemy, for local databases such as the demo's; it is not for data that outgrow a machine.
"""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from checker.audit.errors import AuditConfigError, AuditSourceError

EVIDENCE_SCHEMA = "txn_id string, kind string, producer_group string, created_ms long"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


def jdbc_target(
    url: str, user: str | None = None, password: str | None = None
) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties for ``url``.

    Raises:
        AuditConfigError: neither a ``jdbc:`` URL nor a PostgreSQL SQLAlchemy URL.
    """
    props = {"user": user, "password": password}
    if url.startswith("jdbc:"):
        found = {k: v for k, v in props.items() if v is not None}
        if url.startswith("jdbc:postgresql:"):
            found["driver"] = "org.postgresql.Driver"
        return url, found
    try:
        parsed = make_url(url)
    except ArgumentError as err:
        raise AuditConfigError(f"evidence URL {url!r} is not a URL: {err}") from err
    if parsed.get_backend_name() not in ("postgresql", "postgres"):
        raise AuditConfigError(
            f"evidence URL {parsed.render_as_string(hide_password=True)!r}: give a jdbc: URL "
            "(with its driver jar on Spark's classpath), a postgresql:// URL or sqlite:///"
        )
    host = parsed.host or "localhost"
    port = f":{parsed.port}" if parsed.port else ""
    query = "&".join(f"{k}={v}" for k, v in sorted(parsed.query.items()) if isinstance(v, str))
    jdbc = f"jdbc:postgresql://{host}{port}/{parsed.database or ''}" + (
        f"?{query}" if query else ""
    )
    found = {"driver": "org.postgresql.Driver"}
    if user or parsed.username:
        found["user"] = user or parsed.username or ""
    if password or parsed.password:
        found["password"] = password or str(parsed.password)
    return jdbc, found


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite:")


def read_evidence(
    spark: Any,
    url: str,
    *,
    table: str = "outbox_evidence",
    user: str | None = None,
    password: str | None = None,
) -> Any:
    """The evidence rows as a DataFrame of :data:`EVIDENCE_SCHEMA`.

    Raises:
        AuditConfigError: a bad URL or table name.
        AuditSourceError: the database could not be reached or the table read.
    """
    if not _IDENTIFIER.match(table):
        raise AuditConfigError(f"evidence table {table!r} is not a plain (schema.)table name")
    if is_sqlite(url):
        return spark.createDataFrame(_sqlite_rows(url, table), EVIDENCE_SCHEMA)
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
    from pyspark.sql import functions as F

    jdbc, props = jdbc_target(url, user, password)
    query = f"SELECT txn_id, kind, producer_group, created_at FROM {table}"
    reader = spark.read.format("jdbc").option("url", jdbc).option("query", query)
    for key, value in props.items():
        reader = reader.option(key, value)
    try:
        frame = reader.load()
    except Py4JJavaError as err:
        cause = err.java_exception.toString()
        raise AuditSourceError(f"cannot read {table} from the evidence DB: {cause}") from err
    return frame.select(
        "txn_id", "kind", "producer_group", F.unix_millis("created_at").alias("created_ms")
    )


def _sqlite_rows(url: str, table: str) -> list[tuple[str, str, str, int]]:
    schema, _, name = table.rpartition(".")
    evidence = sa.table(
        name,
        sa.column("txn_id", sa.String),
        sa.column("kind", sa.String),
        sa.column("producer_group", sa.String),
        sa.column("created_at", sa.DateTime(timezone=True)),
        schema=schema or None,
    )
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.select(evidence)).all()
    except SQLAlchemyError as err:
        raise AuditSourceError(f"cannot read {table} from {url}: {err}") from err
    finally:
        engine.dispose()
    return [(r[0], r[1], r[2], _millis(r[3])) for r in rows]


def _millis(value: Any) -> int:
    import datetime as dt

    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int(value.timestamp() * 1000)
