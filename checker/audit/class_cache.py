"""The class-data cache of an audit's own JVM: Spark's classes loaded once, mapped afterwards.

Every local audit starts a JVM that loads, parses and verifies the same ~18,000 classes of
Spark, Scala, Hadoop and Kafka before and during its first jobs: seconds of a short audit's
wall time on two cores. HotSpot (JDK 13 and later) can write the classes one run loaded to an
archive as it exits (``-XX:ArchiveClassesAtExit``, "dynamic CDS") and map that archive, already
parsed and verified, into later runs (``-XX:SharedArchiveFile``). Measured on ``local[2]``
(docs/benchmarks.md, "Where the audit's time goes"): about 5 s less per audit; the run that
writes the archive takes about 20 s more (the JVM writes ~200 MB as it exits).

So it pays for audits run again on one machine (a workstation, a VM, a pod with a volume),
not for one-off runs in a fresh container: it is off unless ``--class-cache DIR`` names a
folder. An archive only fits the JVM, the jars and some of the JVM options (the collector,
object headers) it was written with; its file name is a digest of them, so a new JDK or Spark,
or an audit run with another collector, writes a new archive instead of being refused. A
dynamic archive that does not fit anyway (the JVM checks) is ignored with a warning, and the
audit runs as without one; an AOT cache (below) that does not fit fails the JVM's start, and is
replaced. Options that set up class-data sharing themselves (``-Xshare:off``, an archive of
the user's) keep the cache out of the run altogether (:func:`own_sharing`).

The archive is written to a ``.part`` file and renamed into place only once its JVM has
exited normally, so an audit started meanwhile never maps half an archive: HotSpot crashes
(SIGBUS) mapping a cut-off one. One damaged later anyway makes the JVM fail to start; the
session then deletes it and starts again (:func:`checker.audit.session.start_session`).

Each JDK or Spark upgrade names a new archive (~200 MB) and leaves the old one unused, so the
folder is kept bounded by use, not by upgrades: every audit marks the archive it maps as used
(its modification time) and deletes the folder's archives no audit has used for
:data:`UNUSED_ARCHIVE_S`. Deleting one another JVM has mapped is safe: the JVM keeps its pages.

On JDK 25 and later the cache is HotSpot's ahead-of-time cache instead (``-XX:AOTCacheOutput``
to write it in one run, JEP 514; ``-XX:AOTCache`` to map it, JEP 483): the same classes loaded
and linked, and the profiles of the methods the first run executed (JEP 515), so that the JIT
compiles the hot ones sooner. Measured at 1,000,000 transactions (docs/benchmarks.md): Java 25
with it 78.5 s, with a dynamic archive 81.0 s, Java 17 with its archive 84.4 s. It is mapped with
``-XX:AOTMode=on``: a JVM that cannot use it fails to start (HotSpot otherwise goes on without
it, silently slower every run), and the session deletes it and writes a new one, as for a
damaged dynamic archive. The first run's JVM assembles the cache as it exits by starting a
second JVM with the same options (so a ``-Xlog:...:file=`` of the user's is written twice, the
second over the first), and exits when that one has; the session waits for both.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: The first JDK whose HotSpot writes dynamic class-data archives.
MIN_JAVA = 13
#: The first JDK that writes an ahead-of-time cache, with method profiles, in one run.
AOT_JAVA = 25
#: ``.part`` files older than this are left over from a JVM that died while writing.
STALE_PART_S = 24 * 3600
#: Archives no audit has mapped for this long belong to a JDK or Spark no longer run here.
UNUSED_ARCHIVE_S = 30 * 24 * 3600
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')
#: JVM options that change what an archive holds or whether a JVM can map it (the collector,
#: compressed or compact object headers, object alignment): part of the archive's name, so
#: that audits run with other ones write and map an archive of their own.
_SHAPING = re.compile(r"-XX:[+-]Use\w+|-XX:ObjectAlignmentInBytes=\S+|-Xm[xs]\S+")
#: JVM options by which a user runs class-data sharing their own way: the cache stays out.
_OWN_SHARING = re.compile(r"-Xshare:\S*|-XX:(?:SharedArchiveFile|ArchiveClassesAtExit|AOT\w*)")


@dataclass(frozen=True)
class ClassCache:
    """Where one JVM's archive lives, and the JVM options that write or read it.

    ``write`` is the ``.part`` file this run's JVM writes as it exits (None when the archive
    already exists and is only read); :meth:`finish` renames it into place. ``aot``: an
    ahead-of-time cache (JDK 25+) rather than a dynamic class-data archive.
    """

    archive: Path
    write: Path | None = None
    aot: bool = False

    @property
    def java_options(self) -> str:
        if self.aot:
            if self.write is not None:
                return f"-XX:AOTCacheOutput={self.write}"
            return f"-XX:AOTMode=on -XX:AOTCache={self.archive}"
        if self.write is not None:
            return f"-XX:ArchiveClassesAtExit={self.write}"
        return f"-XX:SharedArchiveFile={self.archive}"

    def finish(self) -> bool:
        """Put a written archive in place (call it once the JVM has exited). True if it did."""
        if self.write is None or not self.write.is_file() or self.write.stat().st_size == 0:
            return False
        os.replace(self.write, self.archive)
        return True


def java_command() -> str | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def java_version(java: str) -> tuple[int, str] | None:
    """The major version and the full ``java -version`` text; None when it does not run."""
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stderr + done.stdout
    found = _VERSION.search(text)
    if done.returncode != 0 or found is None:
        return None
    major = int(found.group(1))
    if major == 1 and found.group(2):  # "1.8.0_392"
        major = int(found.group(2))
    return major, text


#: Where Debian (and the Temurin packages) put JDKs.
JVM_DIR = Path("/usr/lib/jvm")


def newest_jdk(*, above: int = AOT_JAVA - 1) -> tuple[int, Path] | None:
    """The newest JDK under :data:`JVM_DIR` whose major version is above ``above`` (by default
    one that writes an AOT cache), as (major, JAVA_HOME); None when there is none."""
    found = []
    for home in JVM_DIR.glob("*"):
        version = java_version(str(home / "bin" / "java"))
        if version is not None and version[0] > above:
            found.append((version[0], home))
    return max(found) if found else None


def spark_jars_dir() -> Path | None:
    """The jars Spark's launcher puts on the JVM's class path: ``<SPARK_HOME>/jars``, with
    SPARK_HOME found as PySpark's own launcher finds it."""
    try:
        from pyspark.find_spark_home import _find_spark_home
    except ImportError:
        return None
    return Path(_find_spark_home()) / "jars"


def own_sharing(jvm_options: str) -> str | None:
    """The first option in ``jvm_options`` that sets up class-data sharing itself
    (``-Xshare:off``, an archive or AOT cache of the user's): None when there is none."""
    found = _OWN_SHARING.search(jvm_options)
    return found.group(0) if found else None


def digest(java: str, version_text: str, jars: Sequence[Path], jvm_options: str = "") -> str:
    """A name for the archive of one JVM with one class path: the JVM (its real path and
    version), each jar's name and size, and the options that shape an archive (the collector,
    object headers, the heap's size: a JDK 25 refuses an AOT cache written under others, and
    two audits sharing a folder with different ones would otherwise replace each other's at
    every run). Other options (logging, ``-D``) leave the name as it is."""
    h = hashlib.sha256()
    h.update(os.path.realpath(java).encode())
    h.update(version_text.encode())
    h.update("\0".join(_SHAPING.findall(jvm_options)).encode())
    for jar in sorted(jars):
        try:
            size = jar.stat().st_size
        except OSError:
            size = -1
        h.update(f"\0{jar.name}\0{size}".encode())
    return h.hexdigest()[:16]


def class_cache(
    folder: Path, *, extra_jars: Sequence[Path] = (), jvm_options: str = ""
) -> ClassCache | None:
    """The cache of this machine's JVM and Spark under ``folder``, for a JVM started with
    ``jvm_options`` (its heap given as ``-Xmx``); None (run without one) when Java is older
    than 13 or cannot be found, so that the audit never fails for its cache.

    Raises:
        AuditConfigError: ``folder`` cannot be created or written.
    """
    from checker.audit.errors import AuditConfigError

    java = java_command()
    found = java_version(java) if java else None
    if java is None or found is None or found[0] < MIN_JAVA:
        return None
    spark_jars = spark_jars_dir()
    jars = sorted(spark_jars.glob("*.jar")) if spark_jars and spark_jars.is_dir() else []
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AuditConfigError(
            f"--class-cache {folder}: cannot create it ({err}); name a writable folder"
        ) from err
    if not os.access(folder, os.W_OK):
        raise AuditConfigError(f"--class-cache {folder} is not writable; name a writable folder")
    aot = found[0] >= AOT_JAVA
    suffix = ".aot" if aot else ".jsa"
    name = digest(java, found[1], [*jars, *extra_jars], jvm_options)
    archive = folder / f"audit-{name}{suffix}"
    _remove_stale(folder, keep=archive)
    if archive.is_file():
        with contextlib.suppress(OSError):
            os.utime(archive)  # used now: not taken for an archive of an older JVM
        return ClassCache(archive, aot=aot)
    part = folder / f"{archive.name}.{uuid.uuid4().hex[:8]}.part"
    return ClassCache(archive, write=part, aot=aot)


def _remove_stale(folder: Path, *, keep: Path) -> None:
    """Delete ``.part`` files a dead JVM left and archives no audit has used for long."""
    now = time.time()
    # a JDK 25 writing an AOT cache keeps its training run's configuration beside the part
    parts = [*folder.glob("*.part"), *folder.glob("*.part.config")]
    stale = [(part, STALE_PART_S) for part in parts]
    archives = [*folder.glob("audit-*.jsa"), *folder.glob("audit-*.aot")]
    stale += [(a, UNUSED_ARCHIVE_S) for a in archives if a != keep]
    for path, age in stale:
        try:
            if now - path.stat().st_mtime > age:
                path.unlink()
        except OSError:
            pass
