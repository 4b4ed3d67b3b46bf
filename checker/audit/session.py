"""Starting Spark for an audit: ``local[*]`` with the project's cached jars, or spark-submit's.

Spark's Kafka source (``spark-sql-kafka-0-10``) and the PostgreSQL JDBC driver come from Maven
Central through ``make jars`` into ``.cache/jvm/spark``; Spark's own ``--packages`` resolver does
not use Maven's settings, so the jars are passed with ``spark.jars``. Under ``spark-submit`` the
session, its master and its jars are spark-submit's and are left alone.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checker.audit.class_cache import ClassCache, own_sharing
from checker.audit.class_cache import class_cache as find_class_cache
from checker.audit.errors import AuditConfigError, AuditSourceError

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
APP_NAME = "kafka-outbox-audit"


def local_defaults() -> dict[str, str]:
    """Settings of a session the audit starts itself (spark-submit's are left alone).

    Measured on the benchmark's audit of 1,000,000 transactions on ``local[2]`` (247 s with
    Spark's 1 GiB heap and defaults, 162-172 s with these; docs/benchmarks.md):

    - few shuffle partitions: one machine gains nothing from Spark's default of 200, and every
      small stage would pay for them;
    - a driver heap of a quarter of the machine's memory (1-4 GiB, :func:`driver_memory`)
      instead of Spark's 1 GiB: at 1M that heap was full (175 old-generation collections, 3
      full ones, in one run; 247 -> 214 s);
    - the sort-based aggregate for ``collect_list``/``collect_set``: Spark 4's object hash
      aggregate falls back to sorting past 128 groups anyway, and then builds a new buffer per
      group, each field of which looks up the SQL configuration (5% of the CPU in a profile);
    - uncompressed caches: the cached sources live for one run, and the compression
      statistics cost ~8% of the CPU (with the previous: 214 -> 171 s);
    - the parallel (throughput) collector: a batch job has no pause-time goal (171 -> 162 s,
      one run each: within the run-to-run spread);
    - no web UI: nobody watches a scheduled audit's, and keeping its pages up to date costs the
      driver CPU on every job and task (faster in 4 of 4 alternated rounds, medians 74.0 ->
      72.5 s); ``--conf spark.ui.enabled=true`` brings it back for a run someone watches.
    """
    java_options = f"-Dlog4j2.configurationFile={_log_config()} -XX:+UseParallelGC"
    return {
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(max(4, 2 * (os.cpu_count() or 2))),
        "spark.driver.memory": driver_memory(_physical_memory()),
        "spark.sql.execution.useObjectHashAggregateExec": "false",
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # the ledger's plans are wide; Spark warns when it shortens their description
        "spark.sql.debug.maxToStringFields": "200",
        "spark.driver.extraJavaOptions": java_options,
    }


#: Settings whose values are JVM command lines: a user's value is added to the audit's
#: own instead of replacing it (a flight recorder option must not cost the tuned collector).
JAVA_OPTIONS = ("spark.driver.extraJavaOptions",)
_GC_CHOICE = re.compile(r"-XX:\+Use\w*GC\b")


def merge_settings(defaults: Mapping[str, str], user: Mapping[str, str]) -> dict[str, str]:
    """``defaults`` overridden by ``user``, except that JVM options are joined: the user's come
    last, so theirs win where both set one (HotSpot and ``-D`` take the last). A user's choice
    of garbage collector drops ours, since the JVM refuses two."""
    merged = {**defaults, **user}
    for key in JAVA_OPTIONS:
        ours, theirs = defaults.get(key), user.get(key)
        if ours is None or theirs is None:
            continue
        if _GC_CHOICE.search(theirs):
            ours = _GC_CHOICE.sub("", ours)
        merged[key] = " ".join(f"{ours} {theirs}".split())
    return merged


GIB = 1 << 30


def driver_memory(physical_bytes: int | None) -> str:
    """The driver heap for a local session: a quarter of the machine's memory (the JVM's own
    default share), at least Spark's 1 GiB and at most 4 GiB (the size measured)."""
    if not physical_bytes:
        return "1g"
    return f"{max(1, min(4, physical_bytes // (4 * GIB)))}g"


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX, or the name is unknown
        return None


#: Spark's warnings to stderr, one line each, without the start-up chatter an audit run does
#: not need (the native-Hadoop and loopback-address notices).
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
"""


def _log_config() -> Path:
    path = Path(tempfile.gettempdir()) / "kafka-outbox-audit-log4j2.properties"
    if not path.exists() or path.read_text() != LOG4J2:
        path.write_text(LOG4J2)
    return path


def cached_jars_dir() -> Path:
    """``$OUTBOX_CACHE_DIR/jvm/spark``, else the checkout's ``.cache/jvm/spark``."""
    cache = os.environ.get("OUTBOX_CACHE_DIR")
    if cache:
        return Path(cache) / "jvm" / "spark"
    checkout = Path(__file__).resolve().parents[2]
    return checkout / ".cache" / "jvm" / "spark"


def connector_jars(jars_dir: Path) -> list[Path]:
    """The jars of ``jars_dir``, which must include Spark's Kafka source.

    Raises:
        AuditConfigError: no ``spark-sql-kafka`` jar there; the message says how to get it.
    """
    jars = sorted(jars_dir.glob("*.jar"))
    if not any(j.name.startswith("spark-sql-kafka") for j in jars):
        raise AuditConfigError(
            f"no spark-sql-kafka jar in {jars_dir}: run `make jars` (Maven Central), pass "
            "--jars-dir, or run under spark-submit with --jars / --packages "
            "org.apache.spark:spark-sql-kafka-0-10_2.13:<pyspark version>"
        )
    return jars


def under_spark_submit() -> bool:
    """True in a driver started by ``spark-submit`` (it hands Python its JVM gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


#: How long :meth:`Session.close` waits for a JVM writing its class-data archive as it exits.
ARCHIVE_WAIT_S = 300.0


@dataclass
class Session:
    """A SparkSession and whether this audit started it (and so must stop it).

    ``class_cache`` is set when the session's JVM writes or reads a class-data archive
    (:mod:`checker.audit.class_cache`).
    """

    spark: Any
    owned: bool
    class_cache: ClassCache | None = None

    def close(self) -> None:
        if not self.owned:
            return
        self.spark.stop()
        writing = self.class_cache is not None and self.class_cache.write is not None
        # The JVM writes the archive as it exits: end it now, wait, then put the archive in
        # place (an audit started meanwhile must not map a half-written one).
        if writing and _end_jvm(ARCHIVE_WAIT_S) and self.class_cache is not None:
            self.class_cache.finish()


def _end_jvm(timeout_s: float) -> bool:
    """End the JVM PySpark started (it exits when its stdin closes); True once it has exited
    normally. A JVM that failed to write its archive exits otherwise, and a cut-off archive
    must never be put in place: HotSpot crashes (SIGBUS) mapping one."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is not None:
        gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is None or proc.stdin is None:
        return False
    proc.stdin.close()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning(
            "the audit's JVM is still writing its class-data archive after %.0f s; it is not used",
            timeout_s,
        )
        return False
    if proc.returncode != 0:
        log.warning(
            "the audit's JVM exited %s writing its class-data archive; it is not used",
            proc.returncode,
        )
        return False
    return True


def _ignored(class_cache: Path | None, why: str) -> None:
    """Say that ``--class-cache`` does nothing for a JVM this audit did not start."""
    if class_cache is not None:
        log.warning(
            "--class-cache %s is ignored: %s; give that JVM -XX:SharedArchiveFile=FILE "
            "(-XX:AOTCache=FILE on Java 25+; spark.driver.extraJavaOptions) to map an archive",
            class_cache,
            why,
        )


def class_cache_for(
    folder: Path, settings: Mapping[str, str], jars: Sequence[Path]
) -> ClassCache | None:
    """The class cache in ``folder`` of a local session started with ``settings`` (the audit's
    own merged with the user's: :func:`merge_settings`) and the connector ``jars``; None, with a
    warning, when the user's JVM options set up class-data sharing themselves."""
    options = settings.get(JAVA_OPTIONS[0], "")
    theirs = own_sharing(options)
    if theirs is not None:
        _ignored(folder, f"spark.driver.extraJavaOptions sets up its own ({theirs})")
        return None
    heap = settings.get("spark.driver.memory", "")
    return find_class_cache(folder, extra_jars=jars, jvm_options=f"{options} -Xmx{heap}")


def start_session(
    *,
    master: str | None = None,
    jars_dir: Path | None = None,
    conf: Mapping[str, str] | None = None,
    class_cache: Path | None = None,
) -> Session:
    """The running session if there is one (tests, notebooks, spark-submit), else a new one.

    ``class_cache`` names the folder of the JVM's class-data archive
    (:mod:`checker.audit.class_cache`); it applies only to a session started here, not under
    spark-submit or to a running session (a warning says so). When the JVM does not start
    with an archive, the archive is deleted and the session started once more, writing a new
    one.

    Raises:
        AuditConfigError: the Kafka source's jars are missing.
        AuditSourceError: Spark (Java) could not start.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        _ignored(class_cache, "a running SparkSession's JVM is used")
        return Session(active, owned=False)
    builder = SparkSession.builder.appName(APP_NAME)
    settings = dict(conf or {})
    cache: ClassCache | None = None
    if not under_spark_submit():
        builder = builder.master(master or DEFAULT_MASTER)
        jars = connector_jars(jars_dir or cached_jars_dir())
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
        settings = merge_settings(local_defaults(), settings)
        if class_cache is not None:
            cache = class_cache_for(class_cache, settings, jars)
            if cache is not None:
                settings[JAVA_OPTIONS[0]] += f" {cache.java_options}"
    else:
        _ignored(class_cache, "spark-submit started the JVM")
        if master:
            builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as err:  # py4j / JVM start-up failures have no common base class
        if cache is not None and cache.write is None:
            # A damaged archive (a full or failing disk, a copy cut short) crashes HotSpot as it
            # maps it, every time, and a JDK 25 refuses an AOT cache it cannot use (AOTMode=on):
            # drop it and start again, which writes a new one.
            log.warning(
                "Spark did not start with the class-data archive %s (%s); deleted it, "
                "starting again without it, writing a new one",
                cache.archive,
                err,
            )
            cache.archive.unlink(missing_ok=True)
            return start_session(
                master=master, jars_dir=jars_dir, conf=conf, class_cache=class_cache
            )
        raise AuditSourceError(f"Spark could not start: {err}") from err
    spark.sparkContext.setLogLevel("WARN")
    return Session(spark, owned=True, class_cache=cache)
