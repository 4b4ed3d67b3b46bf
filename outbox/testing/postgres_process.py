"""A throwaway PostgreSQL cluster run as local processes (``initdb`` + ``pg_ctl``).

PostgreSQL refuses to run as root, so as root the cluster runs as the ``postgres`` system user
that Debian's package creates.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from outbox.testing.left_processes import new_workdir, service_env
from outbox.testing.ports import free_port
from outbox.testing.readiness import wait_for_postgres
from outbox.testing.service import RunningService, ServiceStartError
from outbox.testing.settings import HarnessSettings

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl) not found; install Debian's package with "
    "`apt-get install postgresql` (run `make setup` as root to do it for you)"
)
#: ``wal_level=logical`` lets Debezium's connector (baseline C of the benchmarks, and its test)
#: decode the WAL; it is set at start-up only, and costs the others a few bytes of WAL per row.
SERVER_OPTIONS = (
    "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
    "-c wal_level=logical"
)


def find_bindir() -> Path:
    """The newest installed server's bin folder, installing Debian's package first as root."""
    found = _bindirs()
    if not found and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", "postgresql"], env=env, check=False)
        found = _bindirs()
    if not found:
        raise ServiceStartError(INSTALL_HINT)
    return found[-1]


def _bindirs() -> list[Path]:
    dirs = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    on_path = shutil.which("initdb")
    if on_path:
        dirs.append(Path(on_path).resolve().parent)
    return sorted({d for d in dirs if (d / "pg_ctl").exists()}, key=_version_key)


def _version_key(path: Path) -> tuple[int, str]:
    name = path.parent.name
    return (int(name) if name.isdigit() else 0, str(path))


class PostgresProcess:
    """One cluster in its own temporary folder, listening on a free loopback port."""

    def __init__(self) -> None:
        self.bindir = find_bindir()
        self.user = _run_as_user()
        self.workdir = new_workdir("outbox-pg-")
        self.data = self.workdir / "data"
        self.log_file = self.workdir / "postgres.log"
        self.port = free_port()
        if self.user is not None:
            os.chown(self.workdir, self.user.pw_uid, self.user.pw_gid)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _cmd(self, tool: str, *args: str) -> None:
        """Run one of PostgreSQL's tools; the server ``pg_ctl start`` detaches carries this
        session as its owner (:mod:`outbox.testing.left_processes`)."""
        done = subprocess.run(
            [str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            user=self.user.pw_uid if self.user else None,
            group=self.user.pw_gid if self.user else None,
            cwd=self.workdir,
            env=service_env(),
        )
        if done.returncode != 0:
            raise ServiceStartError(
                f"{tool} failed ({done.returncode}): {done.stderr or done.stdout}\n{self.logs()}"
            )

    def start(self) -> None:
        self._cmd("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self._start()
        atexit.register(self.kill)

    def _start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.workdir} {SERVER_OPTIONS}"
        self._cmd(
            "pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(self.log_file), "-o", options
        )
        wait_for_postgres(self.url, timeout=30)

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._cmd("pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w")

    def kill(self) -> None:
        with contextlib.suppress(ServiceStartError):
            self.stop("immediate")

    def restart(self) -> None:
        self.stop()
        self._start()

    def logs(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""


def start_postgres_process(settings: HarnessSettings) -> RunningService:
    """Start a cluster; its folder is removed on ``stop()``."""
    del settings  # nothing configurable yet; kept for a uniform provider signature
    cluster = PostgresProcess()
    cluster.start()

    def stop() -> None:
        cluster.stop()
        shutil.rmtree(cluster.workdir, ignore_errors=True)

    return RunningService(
        name="postgresql",
        provider="local",
        address=cluster.url,
        _stop=stop,
        _logs=cluster.logs,
        _restart=cluster.restart,
    )


def _run_as_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError as err:
        raise ServiceStartError(
            "running as root, but there is no `postgres` user to run the server as; "
            "install Debian's `postgresql` package or run the tests as a normal user"
        ) from err
