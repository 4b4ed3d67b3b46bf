"""Container images: the official ones where a registry is reachable, else built here.

Without a registry (this project's CI) the Kafka image is assembled from the machine's own JDK and
the Maven-resolved broker jars, and the PostgreSQL image from Debian's binaries, each with a
static busybox as ``/bin/sh``; ``podman import`` turns the folder into an image. Images are tagged
with a hash of their recipe and built once per machine.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path

from outbox.testing.engine import Engine
from outbox.testing.service import ServiceStartError
from outbox.testing.settings import LOCAL_KAFKA_IMAGE, LOCAL_POSTGRES_IMAGE, HarnessSettings

JDK = Path("/usr/lib/jvm/java-17-openjdk-amd64")
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "env", "sed", "grep", "tr", "cat", "mkdir", "echo", "ls", "id", "rm", "sleep")
POSTGRES_UID = 999

KAFKA_ENTRYPOINT = r"""#!/bin/sh
# Emulates the official apache/kafka image's contract: KAFKA_FOO_BAR=x becomes foo.bar=x
# (___ -> -, __ -> _, _ -> .), CLUSTER_ID formats the storage, KAFKA_HEAP_OPTS sets the heap.
set -e
CONF=/tmp/server.properties
: > "$CONF"
env | grep '^KAFKA_' | grep -v -e '^KAFKA_HEAP_OPTS=' -e '^KAFKA_OPTS=' |
while IFS='=' read -r name value; do
  key=$(echo "${name#KAFKA_}" | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g' | tr 'A-Z' 'a-z')
  echo "$key=$value" >> "$CONF"
done
CP='/opt/kafka/libs/*'
/opt/java/bin/java -cp "$CP" kafka.tools.StorageTool format -t "$CLUSTER_ID" -c "$CONF" --ignore-formatted
exec /opt/java/bin/java ${KAFKA_HEAP_OPTS:--Xmx512m} $KAFKA_OPTS \
  -Dlog4j2.configurationFile=/opt/kafka/log4j2.properties -cp "$CP" kafka.Kafka "$CONF"
"""

KAFKA_LOG4J = """status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""

POSTGRES_ENTRYPOINT = r"""#!/bin/sh
# The subset of the official postgres image's contract the tests use: trust auth, the
# POSTGRES_USER superuser, arguments passed on to the server.
set -e
PGDATA=/var/lib/postgresql/data
BIN=/usr/lib/postgresql/{major}/bin
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  "$BIN/initdb" -D "$PGDATA" -U "${{POSTGRES_USER:-postgres}}" --auth=trust --no-locale -E UTF8 >/dev/null
  echo "host all all 0.0.0.0/0 trust" >> "$PGDATA/pg_hba.conf"
fi
exec "$BIN/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/tmp "$@"
"""


def kafka_image(settings: HarnessSettings, engine: Engine) -> str:
    """The Kafka image to run: the configured one, a locally built one, or the official one."""
    if settings.kafka_image:
        return settings.kafka_image
    if not _build_wanted(settings, engine):
        return f"apache/kafka:{settings.kafka_version()}"
    jars = sorted(settings.kafka_jars_dir.glob("*.jar"))
    settings.kafka_classpath()  # fails with the fix when the jars are missing
    recipe = KAFKA_ENTRYPOINT + KAFKA_LOG4J + " ".join(j.name for j in jars) + str(JDK)
    name = f"{LOCAL_KAFKA_IMAGE}:{settings.kafka_version()}-{_digest(recipe)}"
    return _ensure(name, settings, lambda root: _kafka_root(root, jars))


def postgres_image(settings: HarnessSettings, engine: Engine) -> str:
    """The PostgreSQL image to run: configured, built here from Debian's binaries, or official."""
    if settings.postgres_image:
        return settings.postgres_image
    if not _build_wanted(settings, engine):
        return "postgres:16"
    from outbox.testing.postgres_process import find_bindir

    pgroot = find_bindir().parent
    major = pgroot.name
    entrypoint = POSTGRES_ENTRYPOINT.format(major=major)
    name = f"{LOCAL_POSTGRES_IMAGE}:{major}-{_digest(entrypoint + str(pgroot))}"
    return _ensure(name, settings, lambda root: _postgres_root(root, pgroot, entrypoint))


def _build_wanted(settings: HarnessSettings, engine: Engine) -> bool:
    return settings.build_images if settings.build_images is not None else engine.kind == "podman"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    podman = shutil.which("podman")
    if podman is None:
        raise ServiceStartError("building images needs podman (`apt-get install podman`)")
    done = subprocess.run([podman, *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise ServiceStartError(f"podman {args[0]} failed: {done.stderr.strip()}")
    return done


def _ensure(
    name: str,
    settings: HarnessSettings,
    fill: object,
    changes: tuple[str, ...] = ('ENTRYPOINT ["/entrypoint.sh"]',),
) -> str:
    if _podman("image", "exists", name, check=False).returncode == 0:
        return name
    build = settings.cache_dir / "images" / name.rsplit("/", 1)[-1].replace(":", "-")
    shutil.rmtree(build, ignore_errors=True)  # an interrupted earlier build starts over
    root = build / "rootfs"
    root.mkdir(parents=True)
    fill(root)  # type: ignore[operator]
    tar = build / "rootfs.tar"
    _tar(root, tar)
    _podman("import", *(arg for change in changes for arg in ("--change", change)), str(tar), name)
    shutil.rmtree(build, ignore_errors=True)
    return name


def _tar(root: Path, tar: Path) -> None:
    def owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = POSTGRES_UID if info.name.startswith("var/lib/postgresql") else 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(tar, "w") as archive:
        for child in sorted(root.iterdir()):
            archive.add(child, arcname=child.name, filter=owner)


def _base(
    root: Path, binaries: Iterable[Path], entrypoint: str, applets: Iterable[str] = APPLETS
) -> None:
    """busybox as /bin/sh, the loader, the ldd closure of ``binaries``, passwd, group, hosts."""
    for d in ("bin", "etc", "tmp", "lib64"):
        (root / d).mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for applet in applets:
        (root / "bin" / applet).symlink_to("busybox")
    for lib in _ldd_closure(binaries) | {Path("/lib64/ld-linux-x86-64.so.2")}:
        target = root / lib.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib.resolve(), target)
    (root / "etc" / "passwd").write_text(
        f"root:x:0:0:root:/root:/bin/sh\npostgres:x:{POSTGRES_UID}:{POSTGRES_UID}::/tmp:/bin/sh\n"
    )
    (root / "etc" / "group").write_text(f"root:x:0:\npostgres:x:{POSTGRES_UID}:\n")
    (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    script = root / "entrypoint.sh"
    script.write_text(entrypoint)
    script.chmod(0o755)


def _ldd_closure(binaries: Iterable[Path]) -> set[Path]:
    libs: set[Path] = set()
    for binary in binaries:
        done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
        for line in done.stdout.splitlines():
            parts = line.split("=>")
            path = (parts[1] if len(parts) == 2 else parts[0]).strip().split(" ")[0]
            if path.startswith("/"):
                libs.add(Path(path))
    return libs


def _kafka_root(root: Path, jars: list[Path]) -> None:
    java = root / "opt" / "java"
    shutil.copytree(JDK, java, symlinks=False, ignore_dangling_symlinks=True)
    sos = [p for p in JDK.rglob("*.so") if p.is_file()]
    _base(root, [JDK / "bin" / "java", *sos], KAFKA_ENTRYPOINT)
    libs = root / "opt" / "kafka" / "libs"
    libs.mkdir(parents=True)
    for jar in jars:
        os.link(jar, libs / jar.name) if _same_fs(jar, libs) else shutil.copy2(jar, libs)
    (root / "opt" / "kafka" / "log4j2.properties").write_text(KAFKA_LOG4J)


def _postgres_root(root: Path, pgroot: Path, entrypoint: str) -> None:
    major = pgroot.name
    shutil.copytree(pgroot, root / pgroot.relative_to("/"), symlinks=False)
    share = Path("/usr/share/postgresql") / major
    shutil.copytree(share, root / share.relative_to("/"), symlinks=False)
    shutil.copytree("/usr/share/zoneinfo", root / "usr/share/zoneinfo", symlinks=True)
    binaries = [p for p in (pgroot / "bin").iterdir() if p.is_file()]
    plugins = [p for p in (pgroot / "lib").rglob("*.so") if "llvmjit" not in p.name]
    for jit in (root / pgroot.relative_to("/") / "lib").glob("llvmjit*"):
        jit.unlink()  # JIT pulls in all of LLVM; the tests do not need it
    _base(root, [*binaries, *plugins], entrypoint)
    data = root / "var" / "lib" / "postgresql"
    data.mkdir(parents=True)


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev
