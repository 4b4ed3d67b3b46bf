"""The class-data cache of the audit's own JVM (``--class-cache``).

The unit tests use the machine's real ``java`` for its version (and a stand-in ``java`` script
only where an old or broken JVM is the point). The ``processes`` test runs the audit's CLI twice
in processes of its own on seeded topics: the first writes the archive, the second maps it, and
both report the same findings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checker.audit.class_cache import (
    AOT_JAVA,
    MIN_JAVA,
    STALE_PART_S,
    UNUSED_ARCHIVE_S,
    ClassCache,
    class_cache,
    digest,
    java_command,
    java_version,
    newest_jdk,
    own_sharing,
)
from checker.audit.errors import AuditConfigError
from tests.checker.audit.seeded import seed

REPO = Path(__file__).resolve().parents[3]


def _java_major() -> int:
    java = java_command()
    found = java_version(java) if java else None
    return found[0] if found is not None else 0


JAVA_MAJOR = _java_major()
needs_java = pytest.mark.skipif(JAVA_MAJOR < MIN_JAVA, reason=f"no java {MIN_JAVA}+ here")
#: The tests of the dynamic archive run on the machine's java when it writes one (13-24).
needs_dynamic_java = pytest.mark.skipif(
    not MIN_JAVA <= JAVA_MAJOR < AOT_JAVA,
    reason=f"the default java is {JAVA_MAJOR}, not {MIN_JAVA}-{AOT_JAVA - 1}",
)


#: A JDK 25+ beside the default one (the project installs Java 17; many machines also have a
#: newer one under /usr/lib/jvm), for the ahead-of-time cache's end-to-end tests.
_NEWEST = newest_jdk()
NEWER_JDK = _NEWEST[1] if _NEWEST is not None else None
needs_newer_jdk = pytest.mark.skipif(
    NEWER_JDK is None, reason=f"no JDK {AOT_JAVA}+ under /usr/lib/jvm for the AOT cache"
)


def _fake_java(folder: Path, version_line: str, code: int = 0) -> Path:
    """A ``$JAVA_HOME`` whose ``bin/java -version`` prints ``version_line``."""
    home = folder / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\nexit {code}\n")
    java.chmod(0o755)
    return home


@needs_dynamic_java
def test_the_first_run_writes_a_part_file_that_later_runs_read_once_it_is_in_place(
    tmp_path: Path,
) -> None:
    first = class_cache(tmp_path)
    assert first is not None and first.write is not None
    assert first.write.parent == tmp_path and first.write.name.endswith(".part")
    assert first.java_options == f"-XX:ArchiveClassesAtExit={first.write}"
    assert not first.archive.exists()
    # a second audit before the first's JVM has exited writes its own part, reads nothing
    meanwhile = class_cache(tmp_path)
    assert meanwhile is not None and meanwhile.write not in (None, first.write)
    first.write.write_bytes(b"archive")
    assert first.finish()
    assert first.archive.read_bytes() == b"archive" and not first.write.exists()
    later = class_cache(tmp_path)
    assert later == ClassCache(first.archive)
    assert later.java_options == f"-XX:SharedArchiveFile={first.archive}"
    assert not later.finish()  # nothing to put in place


def test_on_jdk_25_the_cache_is_an_aot_cache_written_in_one_run_and_mapped_strictly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path, 'openjdk version "25.0.3" 2026')))
    first = class_cache(tmp_path / "cache")
    assert first is not None and first.aot and first.write is not None
    assert first.archive.name.startswith("audit-") and first.archive.suffix == ".aot"
    assert first.java_options == f"-XX:AOTCacheOutput={first.write}"
    first.write.write_bytes(b"cache")
    assert first.finish()
    later = class_cache(tmp_path / "cache")
    assert later == ClassCache(first.archive, aot=True)
    # strict: a cache the JVM cannot use fails its start, so that the session replaces it
    assert later.java_options == f"-XX:AOTMode=on -XX:AOTCache={first.archive}"


@pytest.mark.parametrize("major", [13, 17, 21, 24])
def test_before_jdk_25_the_cache_is_a_dynamic_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, major: int
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path, f'openjdk version "{major}.0.1"')))
    cache = class_cache(tmp_path / "cache")
    assert cache is not None and not cache.aot and cache.archive.suffix == ".jsa"
    assert cache.java_options.startswith("-XX:ArchiveClassesAtExit=")


def test_a_missing_or_empty_part_file_is_never_put_in_place(tmp_path: Path) -> None:
    cache = ClassCache(tmp_path / "a.jsa", write=tmp_path / "a.jsa.x.part")
    assert not cache.finish()
    cache.write.write_bytes(b"")  # type: ignore[union-attr]
    assert not cache.finish()
    assert not cache.archive.exists()


def test_the_archive_name_changes_with_the_jvm_and_with_any_jar(tmp_path: Path) -> None:
    jar = tmp_path / "spark-core.jar"
    jar.write_bytes(b"x" * 10)
    base = digest("/usr/bin/java", 'openjdk version "17.0.15"', [jar])
    assert base == digest("/usr/bin/java", 'openjdk version "17.0.15"', [jar])
    assert base != digest("/usr/bin/java", 'openjdk version "17.0.16"', [jar])
    assert base != digest("/opt/jdk/bin/java", 'openjdk version "17.0.15"', [jar])
    assert base != digest("/usr/bin/java", 'openjdk version "17.0.15"', [])
    jar.write_bytes(b"x" * 11)  # a new build of the same jar
    assert base != digest("/usr/bin/java", 'openjdk version "17.0.15"', [jar])


def test_options_that_shape_an_archive_are_part_of_the_name_and_logging_is_not() -> None:
    jvm, version = "/usr/bin/java", 'openjdk version "25.0.3"'
    ours = "-Dlog4j2.configurationFile=/tmp/x -XX:+UseParallelGC -Xmx4g"
    base = digest(jvm, version, [], ours)
    assert base == digest(jvm, version, [], f"{ours} -Xlog:class+load=info:file=/tmp/a.log")
    assert base == digest(jvm, version, [], f"{ours} -Dfoo=bar")
    for other in ("-XX:+UseCompactObjectHeaders", "-XX:-UseCompressedOops", "-Xmx40g",
                  "-XX:ObjectAlignmentInBytes=16"):  # fmt: skip
        assert base != digest(jvm, version, [], f"{ours} {other}"), other
    assert base != digest(jvm, version, [], ours.replace("Parallel", "Z"))


@pytest.mark.parametrize(
    ("options", "theirs"),
    [
        ("-XX:+UseParallelGC -Xshare:off", "-Xshare:off"),
        ("-XX:SharedArchiveFile=/opt/app.jsa", "-XX:SharedArchiveFile"),
        ("-XX:AOTCache=/opt/app.aot", "-XX:AOTCache"),
        ("-XX:AOTMode=off", "-XX:AOTMode"),
        ("-XX:ArchiveClassesAtExit=/tmp/a.jsa", "-XX:ArchiveClassesAtExit"),
        ("-XX:+UseParallelGC -Xlog:class+load=info -Dshare=1", None),
    ],
)
def test_options_that_set_up_sharing_themselves_are_found(options: str, theirs: str | None) -> None:
    assert own_sharing(options) == theirs


@needs_java
def test_the_connector_jars_are_part_of_the_name(tmp_path: Path) -> None:
    jar = tmp_path / "kafka-clients.jar"
    jar.write_bytes(b"x")
    without = class_cache(tmp_path / "cache")
    with_jar = class_cache(tmp_path / "cache", extra_jars=[jar])
    assert without is not None and with_jar is not None
    assert without.archive != with_jar.archive


@pytest.mark.parametrize(
    ("line", "code"),
    [('openjdk version "11.0.2" 2019-01-15', 0), ('java version "1.8.0_392"', 0), ("", 1)],
)
def test_a_jvm_too_old_or_broken_runs_the_audit_without_a_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, code: int
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path, line, code)))
    assert class_cache(tmp_path / "cache") is None
    assert not (tmp_path / "cache").exists()


def test_no_java_at_all_runs_the_audit_without_a_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    assert class_cache(tmp_path / "cache") is None


def test_the_version_of_a_jdk_8_reads_as_8(tmp_path: Path) -> None:
    home = _fake_java(tmp_path, 'java version "1.8.0_392"')
    found = java_version(str(home / "bin" / "java"))
    assert found is not None and found[0] == 8


@needs_java
def test_a_folder_that_cannot_be_created_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(AuditConfigError, match=f"--class-cache {blocker / 'cache'}"):
        class_cache(blocker / "cache")


@needs_java
def test_part_files_left_by_a_dead_jvm_are_removed_after_a_day(tmp_path: Path) -> None:
    stale, fresh = tmp_path / "audit-x.jsa.old.part", tmp_path / "audit-x.jsa.new.part"
    # what a JDK 25 killed while writing an AOT cache leaves: its part and its configuration
    aot_stale = [tmp_path / "audit-y.aot.old.part", tmp_path / "audit-y.aot.old.part.config"]
    for part in (stale, *aot_stale):
        part.write_bytes(b"half an archive")
        old = time.time() - STALE_PART_S - 60
        os.utime(part, (old, old))
    fresh.write_bytes(b"half an archive")
    class_cache(tmp_path)
    assert not stale.exists() and fresh.exists()
    assert not any(p.exists() for p in aot_stale)


@needs_dynamic_java
def test_archives_no_audit_used_for_30_days_are_removed_and_the_one_in_use_is_marked_used(
    tmp_path: Path,
) -> None:
    current = class_cache(tmp_path)
    assert current is not None and current.write is not None
    current.archive.write_bytes(b"this JVM's archive")
    old_jdk, recent = tmp_path / "audit-0ld0jdk.jsa", tmp_path / "audit-other0jvm.jsa"
    old_aot = tmp_path / "audit-0ld0jdk25.aot"
    for archive in (old_jdk, recent, old_aot):
        archive.write_bytes(b"an archive of another JVM")
    long_ago = time.time() - UNUSED_ARCHIVE_S - 60
    a_week_ago = time.time() - 7 * 24 * 3600
    os.utime(old_jdk, (long_ago, long_ago))
    os.utime(old_aot, (long_ago, long_ago))
    os.utime(recent, (a_week_ago, a_week_ago))
    os.utime(current.archive, (long_ago, long_ago))  # written long ago, mapped ever since
    mapped = class_cache(tmp_path)
    assert mapped == ClassCache(current.archive)
    assert not old_jdk.exists() and not old_aot.exists()
    assert recent.exists() and current.archive.exists()
    assert time.time() - current.archive.stat().st_mtime < 60  # used now
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([current.archive.name, recent.name])


def test_a_class_cache_for_a_session_the_audit_did_not_start_is_ignored_with_a_warning(
    spark: object, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from checker.audit.session import start_session

    session = start_session(class_cache=tmp_path / "cache")
    assert session.spark is spark and not session.owned and session.class_cache is None
    assert f"--class-cache {tmp_path / 'cache'} is ignored" in caplog.text
    assert not (tmp_path / "cache").exists()


def _audit(
    bootstrap: str,
    prefix: str,
    out: Path,
    cache: Path,
    classes_log: Path,
    *,
    java_home: Path | None = None,
) -> dict:
    env = {**os.environ, **({"JAVA_HOME": str(java_home)} if java_home else {})}
    done = subprocess.run(
        [sys.executable, "-m", "checker.audit", "--bootstrap-servers", bootstrap,
         "--topic-prefix", prefix, "--as-of", "now+10m", "--master", "local[2]",
         "--out", str(out), "--quiet", "--class-cache", str(cache),
         "--conf", f"spark.driver.extraJavaOptions=-Xlog:class+load=info:file={classes_log}"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]  # the seeded anomalies
    summary: dict = json.loads((out / "summary.json").read_text())
    return summary


def _audit_of_no_broker(tmp_path: Path, cache: Path, *args: str) -> str:
    """An audit with ``--class-cache cache`` against a broker nobody runs: Spark starts, the
    audit stops at Kafka (exit 3). Its stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "checker.audit", "--bootstrap-servers", "127.0.0.1:9",
         "--timeout", "2s", "--master", "local[1]", "--out", str(tmp_path / "out"),
         "--class-cache", str(cache), *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-3000:]
    assert "Kafka at 127.0.0.1:9 did not answer" in done.stderr
    return done.stderr


def _cache_the_audit_looks_for(cache: Path) -> ClassCache | None:
    """The cache an audit with ``--class-cache cache`` and no ``--conf`` maps or writes: its
    settings and jars name it."""
    from checker.audit.session import (
        cached_jars_dir,
        class_cache_for,
        connector_jars,
        local_defaults,
        merge_settings,
    )

    settings = merge_settings(local_defaults(), {})
    return class_cache_for(cache, settings, connector_jars(cached_jars_dir()))


def _replaced_when_cut_in_half(expected: ClassCache, whole: Path, tmp_path: Path) -> None:
    """``whole`` (a real archive or AOT cache) cut in half where the audit looks for its cache:
    the audit deletes it, starts again and writes a new one at exit."""
    data = whole.read_bytes()
    expected.archive.write_bytes(data[: len(data) // 2])
    stderr = _audit_of_no_broker(tmp_path, expected.archive.parent)  # Spark started, again
    assert "Spark could not start" not in stderr
    assert "deleted it, starting again without it" in stderr
    assert expected.archive.stat().st_size > len(data)  # the new one, written at exit
    assert not [p for p in expected.archive.parent.iterdir() if ".part" in p.name]


def _same_findings(first: dict, second: dict, expected: dict[str, set[str]]) -> None:
    """Two audits of the seeded topics found the same, and what was seeded."""
    counts = {name: f["count"] for name, f in first["findings"].items()}
    assert counts == {name: f["count"] for name, f in second["findings"].items()}
    assert first["statistics"]["transactions"] == second["statistics"]["transactions"] == 45
    for name in ("lost", "phantom", "duplicate", "partial", "stuck"):
        assert set(second["findings"][name]["sample_txn_ids"]) == expected[name], name


def _from_the_archive(classes_log: Path) -> int:
    """Classes the JVM mapped from the dynamic (top) archive, by its own class-loading log."""
    return classes_log.read_text().count("source: shared objects file (top)")


def _spark_from_shared_files(classes_log: Path) -> int:
    """Spark's classes the JVM mapped from a shared file, by its class-loading log: the JDK's
    own archive holds none, so they come from the audit's AOT cache."""
    return sum(
        "org.apache.spark." in line and "source: shared objects file" in line
        for line in classes_log.read_text().splitlines()
    )


@pytest.mark.integration
@pytest.mark.processes
@needs_dynamic_java
def test_the_second_audit_maps_the_archive_the_first_wrote_and_finds_the_same(
    kafka_bootstrap: str, postgres_url: str, tmp_path: Path
) -> None:
    seeded = seed(kafka_bootstrap, postgres_url)
    cache = tmp_path / "class-cache"
    first = _audit(kafka_bootstrap, seeded.prefix, tmp_path / "a", cache, tmp_path / "a.log")
    archives = list(cache.glob("*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 1_000_000
    assert not list(cache.glob("*.part"))
    assert _from_the_archive(tmp_path / "a.log") == 0
    second = _audit(kafka_bootstrap, seeded.prefix, tmp_path / "b", cache, tmp_path / "b.log")
    assert _from_the_archive(tmp_path / "b.log") > 5_000
    assert list(cache.glob("*.jsa")) == archives
    _same_findings(first, second, seeded.expected)


@pytest.mark.integration
@pytest.mark.processes
@needs_dynamic_java
def test_a_damaged_archive_is_deleted_and_the_audit_starts_again_writing_a_new_one(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "class-cache"
    expected = _cache_the_audit_looks_for(cache)
    assert expected is not None
    # A real archive cut in half (as a full disk or a copy cut short leaves one): HotSpot
    # crashes (SIGBUS) mapping it, at every start.
    whole = tmp_path / "whole.jsa"
    java = java_command()
    assert java is not None
    subprocess.run([java, f"-XX:ArchiveClassesAtExit={whole}", "-version"], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    _replaced_when_cut_in_half(expected, whole, tmp_path)


@pytest.mark.integration
@pytest.mark.processes
@needs_newer_jdk
def test_on_jdk_25_the_second_audit_maps_the_aot_cache_the_first_wrote_and_finds_the_same(
    kafka_bootstrap: str, postgres_url: str, tmp_path: Path
) -> None:
    seeded = seed(kafka_bootstrap, postgres_url)
    cache = tmp_path / "class-cache"
    first = _audit(kafka_bootstrap, seeded.prefix, tmp_path / "a", cache, tmp_path / "a.log",
                   java_home=NEWER_JDK)  # fmt: skip
    caches = list(cache.iterdir())
    assert [c.suffix for c in caches] == [".aot"] and caches[0].stat().st_size > 1_000_000
    # (the first run's log is not read: the JVM that assembles the cache at exit, which the
    # training run starts with the same options, writes its own over it)
    second = _audit(kafka_bootstrap, seeded.prefix, tmp_path / "b", cache, tmp_path / "b.log",
                    java_home=NEWER_JDK)  # fmt: skip
    assert _spark_from_shared_files(tmp_path / "b.log") > 2_000  # 5,664 here; 0 without
    assert list(cache.iterdir()) == caches
    _same_findings(first, second, seeded.expected)


@pytest.mark.integration
@pytest.mark.processes
@needs_newer_jdk
def test_on_jdk_25_a_damaged_aot_cache_is_deleted_and_the_audit_starts_again_writing_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(NEWER_JDK))
    cache = tmp_path / "class-cache"
    expected = _cache_the_audit_looks_for(cache)
    assert expected is not None and expected.aot
    # A real AOT cache cut in half: without AOTMode=on HotSpot would run on without it, every
    # time, and the audit would stay slow with nobody told.
    whole = tmp_path / "whole.aot"
    subprocess.run([str(NEWER_JDK / "bin" / "java"), f"-XX:AOTCacheOutput={whole}", "-version"],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    _replaced_when_cut_in_half(expected, whole, tmp_path)


@pytest.mark.integration
@pytest.mark.processes
@needs_java
def test_jvm_options_that_set_up_their_own_sharing_keep_the_cache_out_with_a_warning(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "class-cache"
    # Spark starts (with the user's -Xshare:off, no archive of ours beside it)
    stderr = _audit_of_no_broker(
        tmp_path, cache, "--conf", "spark.driver.extraJavaOptions=-Xshare:off"
    )
    assert f"--class-cache {cache} is ignored" in stderr
    assert "sets up its own (-Xshare:off)" in stderr
    assert not cache.exists()
