"""``kafka-outbox audit`` / ``python -m checker.audit``: audit the topics with Spark.

Usage::

    python -m checker.audit --bootstrap-servers kafka:9092 --from now-2h --to now-10m \\
        --out /tmp/audit [--jdbc-url postgresql://user@db/orders] [--master local[*]]

``--from`` / ``--to`` take ``earliest`` / ``latest``, a time (ISO-8601, Unix ms, ``now``,
``now-2h``) or Spark's offsets JSON (``{"__outbox-half": {"0": 120}}``); transactions whose
first half record lies in [from, to) are audited. Durations (``--grace``, ``--window``, ...)
take ``90s``, ``500ms``, ``5m``, ``2h``; a bare number is seconds. Unset options fall back to
``OUTBOX_AUDIT_*`` variables and the config file's ``[audit]`` section. docs/audit.md has the
details.

Exit codes:
    0  the audit is clean
    1  violations were found (see the report and the Parquet findings)
    2  bad usage or configuration (arguments, missing jars, the internal topics do not exist)
    3  the audit could not run (Kafka or the evidence DB unreachable, Spark did not start)

This module does not import pyspark until an audit really runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from checker.audit.bounds import parse_duration_ms
from checker.audit.errors import AuditConfigError, AuditSourceError
from outbox.env import CONFIG_FILE_VARIABLE
from outbox.errors import ConfigurationError

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
log = logging.getLogger("checker.audit")


def build_parser(prog: str = "kafka-outbox audit") -> argparse.ArgumentParser:
    """The audit's arguments; ``kafka-outbox`` mounts the same ones as its ``audit`` command."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Audit the outbox topics with Spark: lost, phantom, duplicate, partial, "
        "stuck, out-of-order, given-up and conflicting transactions. Exit 0 clean, 1 violations, "
        "2 bad usage, 3 could not run.",
    )
    add = parser.add_argument
    # the options every kafka-outbox command takes, and Kafka's tools' names for the cluster
    add(
        "--config",
        metavar="FILE",
        help="TOML (or YAML) settings file; its [audit] section (also: OUTBOX_CONFIG_FILE)",
    )
    add("--debug", action="store_true", help="log at DEBUG and show tracebacks")
    add(
        "--bootstrap-server",
        "--bootstrap-servers",
        dest="bootstrap_servers",
        metavar="HOST:PORT[,...]",
        help="Kafka bootstrap servers (env OUTBOX_AUDIT_BOOTSTRAP_SERVERS or the shared one)",
    )
    add(
        "--command-config",
        metavar="FILE",
        help="librdkafka settings for the Kafka source (key=value lines), as Kafka's tools take "
        "them; --kafka-option wins over them",
    )
    add("--topic-prefix", help="prefix of the internal topics (default __outbox)")
    add("--from", dest="start", help="earliest (default), a time, or offsets JSON")
    add("--to", dest="end", help="latest (default), a time, or offsets JSON")
    add("--as-of", help="the audit's clock: ignore records stamped later (default now)")
    add("--grace", help="time after a COMMIT before missing messages count as lost (60s)")
    add("--window", help="full check window; undecided longer = stuck (default from below)")
    add("--transaction-timeout", help="the checker's transaction timeout (6s)")
    add("--check-interval", help="the checker's check interval (30s)")
    add("--check-max", type=int, help="the checker's maximum number of checks (15)")
    add("--lookback", help="with a time --from, read this much earlier (default window+grace)")
    add("--real-topic", action="append", default=[], help="also read this real topic (repeat)")
    add("--jdbc-url", help="producers' DB: jdbc:postgresql://..., postgresql://... or sqlite:///")
    add("--jdbc-user", help="DB user, when not in the URL")
    add("--jdbc-password-env", help="name of the variable holding the DB password")
    add("--evidence-table", help="evidence table (default outbox_evidence)")
    add("--evidence-group", action="append", default=[], help="group the DB covers (repeat)")
    add("--out", help="output folder: summary.json, report.html, findings/ (outbox-audit)")
    add("--parquet-dir", help="where the Parquet findings go instead (e.g. hdfs://...)")
    add("--report-rows", type=int, help="rows of each finding shown in the report (200)")
    add(
        "--timeout",
        "--metadata-timeout",
        dest="metadata_timeout",
        help="how long to wait for Kafka to answer (15s)",
    )
    add(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Kafka client setting for the source, e.g. security.protocol=SSL (repeat)",
    )
    add("--master", help="Spark master (default local[*]; spark-submit's under spark-submit)")
    add("--jars-dir", help="folder of the Kafka source's jars (default .cache/jvm/spark)")
    add("--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark setting (repeat)")
    add(
        "--class-cache",
        metavar="DIR",
        help="keep the JVM's class-data archive here: the first audit writes it (~200 MB, "
        "~20 s more), later ones start ~5 s sooner (default: none)",
    )
    add("--quiet", action="store_true", help="print only the verdict line")
    return parser


def _pairs(values: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AuditConfigError(f"{what} {item!r} must be KEY=VALUE")
        pairs[key.strip()] = value
    return pairs


def _kafka(args: argparse.Namespace) -> dict[str, Any]:
    """The Kafka source's settings: the environment's and config file's (``OUTBOX_AUDIT_KAFKA__*``,
    ``[audit.kafka]``), then ``--command-config`` over them (its ``bootstrap.servers`` aside),
    then ``--kafka-option``. Keys are the Java client's: Spark's Kafka source is Java."""
    from checker.audit.settings import ENV_PREFIX, FALLBACKS, AuditSettings
    from outbox.env import KAFKA_FIELD, collect
    from outbox.properties import load_properties

    configured, _ = collect(AuditSettings, ENV_PREFIX, None, {}, fallbacks=FALLBACKS)
    found = load_properties(args.command_config) if args.command_config else {}
    if args.bootstrap_servers is None and "bootstrap.servers" in found:
        args.bootstrap_servers = found["bootstrap.servers"]
    found.pop("bootstrap.servers", None)
    merged: dict[str, Any] = dict(configured.get(KAFKA_FIELD, {}))
    return merged | found | _pairs(args.kafka_option, "--kafka-option")


def _seconds(text: str | None, what: str) -> float | None:
    return None if text is None else parse_duration_ms(text, what=what) / 1000


def settings_from(args: argparse.Namespace) -> Any:
    """AuditSettings from the arguments, over ``OUTBOX_AUDIT_*`` and the config file.

    Raises:
        ConfigurationError: a bad or missing value.
    """
    from checker.audit.settings import AuditSettings

    password = None
    if args.jdbc_password_env:
        password = os.environ.get(args.jdbc_password_env)
        if password is None:
            raise AuditConfigError(f"--jdbc-password-env: ${args.jdbc_password_env} is not set")
    kafka = _kafka(args)  # first: the file may name the cluster
    given: dict[str, Any] = {
        "bootstrap_servers": args.bootstrap_servers,
        "topic_prefix": args.topic_prefix,
        "start": args.start,
        "end": args.end,
        "as_of": args.as_of,
        "grace_s": _seconds(args.grace, "--grace"),
        "window_s": _seconds(args.window, "--window"),
        "transaction_timeout_s": _seconds(args.transaction_timeout, "--transaction-timeout"),
        "check_interval_s": _seconds(args.check_interval, "--check-interval"),
        "check_max": args.check_max,
        "lookback_s": _seconds(args.lookback, "--lookback"),
        "real_topics": tuple(args.real_topic) or None,
        "evidence_url": args.jdbc_url,
        "evidence_user": args.jdbc_user,
        "evidence_password": password,
        "evidence_table": args.evidence_table,
        "evidence_groups": tuple(args.evidence_group) or None,
        "out_dir": args.out,
        "parquet_dir": args.parquet_dir,
        "report_rows": args.report_rows,
        "metadata_timeout_s": _seconds(args.metadata_timeout, "--timeout"),
        "kafka": kafka or None,
    }
    return AuditSettings.from_env(**{k: v for k, v in given.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    """Run one audit; returns the exit code (module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
        return int(exit_.code or 0)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s %(message)s",
    )
    before = os.environ.get(CONFIG_FILE_VARIABLE)
    if args.config:
        os.environ[CONFIG_FILE_VARIABLE] = args.config
    try:
        return _audit(args)
    finally:  # main() called in-process leaves the environment as it was
        if before is None:
            os.environ.pop(CONFIG_FILE_VARIABLE, None)
        else:
            os.environ[CONFIG_FILE_VARIABLE] = before


def _audit(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
        spark_conf = _pairs(args.conf, "--conf")
    except ConfigurationError as err:
        print(f"audit: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _run(settings, args, spark_conf)
    except ConfigurationError as err:
        print(f"audit: {err}", file=sys.stderr)
        return EXIT_USAGE
    except AuditSourceError as err:
        print(f"audit: could not run: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except Exception as err:  # Spark/Kafka failing mid-run: no verdict, never "violations"
        log.exception("audit failed")
        print(f"audit: could not run: {err.__class__.__name__}: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def _run(settings: Any, args: argparse.Namespace, spark_conf: dict[str, str]) -> int:
    try:
        from checker.audit.job import run_audit
        from checker.audit.session import start_session
    except ImportError as err:
        raise AuditConfigError(
            f"the audit needs Spark ({err}); install it with pip install 'kafka-outbox[audit]'"
        ) from err
    session = start_session(
        master=args.master,
        jars_dir=Path(args.jars_dir) if args.jars_dir else None,
        conf=spark_conf,
        class_cache=Path(args.class_cache) if args.class_cache else None,
    )
    try:
        result = run_audit(session.spark, settings)
    finally:
        session.close()
    if not args.quiet:
        print_summary(result.summary)
    verdict = "CLEAN" if result.clean else "VIOLATIONS"
    rows = result.summary["violations"]
    print(f"audit {verdict}: {rows} violation rows; report {result.report_path}")
    return EXIT_CLEAN if result.clean else EXIT_VIOLATIONS


def print_summary(summary: dict[str, Any]) -> None:
    """Findings and headline counts, one per line."""
    stats = summary["statistics"]
    print(
        f"transactions audited {stats['transactions']}  by state {stats['by_state']}  "
        f"by decider {stats['by_decider']}"
    )
    for name, finding in summary["findings"].items():
        marker = "!!" if finding["count"] else "ok"
        print(f"  {marker} {name:<24} {finding['count']:>8}")
    unjudged = {n: stats.get(n, 0) for n in UNVERIFIABLE if stats.get(n, 0)}
    for name, count in unjudged.items():
        print(f"  ?? {name:<24} {count:>8}  (retention removed what would tell: docs/audit.md)")
    unknown = summary.get("parameters", {}).get("retention_unknown")
    if unknown:
        print(f"  ?? what the topics still hold is unknown: {unknown}")


#: The statistics counting what the audit could not judge because the topics no longer hold it.
UNVERIFIABLE = ("commits_unverifiable", "records_unverifiable")
