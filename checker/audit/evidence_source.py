"""Reading the producers' evidence table: over JDBC into Spark, or SQLite on the driver.

``jdbc:postgresql://...`` URLs go to Spark's JDBC source as they are (the PostgreSQL driver is
among the cached jars); SQLAlchemy URLs of PostgreSQL (``postgresql+psycopg://u:p@h/db``, the
form the producers use) are translated. ``sqlite:///file`` is read on the driver through
SQLAlchemy, for local databases such as the demo's; it is not for data that outgrow a machine.

Beside the evidence table, :func:`read_horizon` reads the pruning horizon ``outbox.pruning``
records before it deletes old rows (table ``outbox_evidence_horizon``, migration
``outbox_0002``): a COMMIT whose row may be one of those pruned is no violation.
"""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from checker.audit.errors import AuditConfigError, AuditSourceError
from outbox.evidence import horizon_table

EVIDENCE_SCHEMA = "txn_id string, kind string, producer_group string, created_ms long"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
#: SQLSTATEs that mean "no such table": PostgreSQL's ``undefined_table``, the ODBC/X/Open one
#: (MySQL, SQL Server, H2) and Db2's. A database migrated only to ``outbox_0001`` answers the
#: horizon query with one of them.
_UNDEFINED_TABLE = frozenset({"42P01", "42S02", "42704"})


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

    query = f"SELECT txn_id, kind, producer_group, created_at FROM {table}"
    reader = _jdbc_reader(spark, url, query, user, password)
    try:
        frame = reader.load()
    except Py4JJavaError as err:
        cause = err.java_exception.toString()
        raise AuditSourceError(f"cannot read {table} from the evidence DB: {cause}") from err
    return frame.select(
        "txn_id", "kind", "producer_group", F.unix_millis("created_at").alias("created_ms")
    )


def horizon_table_for(table: str) -> str:
    """The pruning horizon's table for the evidence table ``table``: the migration's name, in
    ``table``'s schema. Migration ``outbox_0002`` creates it beside the evidence table, so it
    keeps its name when the audit reads the evidence under another one (a view, a copy)."""
    schema, dot, _ = table.rpartition(".")
    return f"{schema}{dot}{horizon_table.name}"


def read_horizon(
    spark: Any,
    url: str,
    *,
    table: str = "outbox_evidence",
    user: str | None = None,
    password: str | None = None,
) -> int | None:
    """The pruning horizon of the evidence table ``table`` (Unix ms): rows created before it
    may have been deleted (:mod:`outbox.pruning`).

    None when the table was never pruned, and when its database has no horizon table (migrated
    only to ``outbox_0001``, whose producers cannot prune): then every row is still there.

    Raises:
        AuditConfigError: a bad URL or table name.
        AuditSourceError: the database could not be reached or the horizon table read.
    """
    if not _IDENTIFIER.match(table):
        raise AuditConfigError(f"evidence table {table!r} is not a plain (schema.)table name")
    horizon = horizon_table_for(table)
    if is_sqlite(url):
        return _sqlite_horizon(url, horizon)
    return _jdbc_horizon(spark, url, horizon, user, password)


def _jdbc_reader(spark: Any, url: str, query: str, user: str | None, password: str | None) -> Any:
    jdbc, props = jdbc_target(url, user, password)
    reader = spark.read.format("jdbc").option("url", jdbc).option("query", query)
    for key, value in props.items():
        reader = reader.option(key, value)
    return reader


def _jdbc_horizon(
    spark: Any, url: str, table: str, user: str | None, password: str | None
) -> int | None:
    """Read on the driver (one row at most); a missing table is told apart from other errors
    by its SQLSTATE, portable across JDBC drivers where the message is not."""
    from py4j.protocol import Py4JJavaError

    query = f"SELECT pruned_before_ms FROM {table} WHERE id = 1"
    try:
        rows = _jdbc_reader(spark, url, query, user, password).load().collect()
    except Py4JJavaError as err:
        if _sql_states(spark, err) & _UNDEFINED_TABLE:
            return None
        cause = err.java_exception.toString()
        raise AuditSourceError(f"cannot read {table} from the evidence DB: {cause}") from err
    return int(rows[0][0]) if rows else None


def _sql_states(spark: Any, err: Any) -> set[str]:
    """The SQLSTATEs of the ``java.sql.SQLException`` s among a Java error and its causes."""
    from py4j.java_gateway import is_instance_of  # type: ignore[import-untyped]

    gateway = spark.sparkContext._gateway
    states: set[str] = set()
    cause = err.java_exception
    for _ in range(20):  # Spark wraps a driver's error a few levels deep at most
        if cause is None:
            break
        if is_instance_of(gateway, cause, "java.sql.SQLException"):
            states.add(str(cause.getSQLState()))
        cause = cause.getCause()
    return states


def _sqlite_horizon(url: str, table: str) -> int | None:
    schema, _, name = table.rpartition(".")
    horizon = sa.table(name, sa.column("id"), sa.column("pruned_before_ms"), schema=schema or None)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(name, schema=schema or None):
                return None
            query = sa.select(horizon.c.pruned_before_ms).where(horizon.c.id == 1)
            value = conn.execute(query).scalar()
    except SQLAlchemyError as err:
        raise AuditSourceError(f"cannot read {table} from {url}: {err}") from err
    finally:
        engine.dispose()
    return None if value is None else int(value)


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
