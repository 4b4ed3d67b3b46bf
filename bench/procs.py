"""Child processes of a benchmark: relays, checkers, the check endpoint, consumers.

Each runs as ``python -m <module>`` from the checkout, logs to a file in the run's folder, and
stops on SIGTERM. Under ``--profile`` the services run under pyinstrument, which writes a
session file when the process exits; :func:`render_profiles` turns them into HTML and text.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

ROOT = Path(__file__).resolve().parents[1]


class Context:
    """Where a run keeps its logs, and whether its services are profiled."""

    def __init__(self, folder: Path, *, profile: bool = False) -> None:
        self.folder = folder
        self.logs = folder / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.profile_dir: Path | None = folder / "profile" if profile else None
        if self.profile_dir is not None:
            self.profile_dir.mkdir(parents=True, exist_ok=True)


class Child:
    """``python -m module args`` (or ``command``) with ``env`` added to the environment."""

    def __init__(
        self,
        ctx: Context,
        name: str,
        module: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        *,
        profiled: bool = True,
        command: Sequence[str] | None = None,
    ) -> None:
        self.name = name
        self.log = ctx.logs / f"{name}.log"
        if command is not None:  # not Python (the JVM relay floor): never profiled
            self.command = list(command)
        elif ctx.profile_dir is not None and profiled:
            session = ctx.profile_dir / f"{name}.pyisession"
            self.command = [
                sys.executable, "-m", "pyinstrument", "-r", "pyisession", "-o", str(session),
                "-m", module, *args,
            ]  # fmt: skip
        else:
            self.command = [sys.executable, "-m", module, *args]
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, stdout: int | None = None) -> Child:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command,
                env=self.env,
                cwd=ROOT,
                stdout=stdout if stdout is not None else out,
                stderr=out,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for_log(self, predicate: Callable[[str], bool], timeout: float, what: str) -> None:
        """Block until the log satisfies ``predicate``.

        Raises:
            RuntimeError: the process died or the time ran out; with the log's tail.
        """
        deadline = time.monotonic() + timeout
        while not predicate(self.log_text()):
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no {what} within {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.1)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait, SIGKILL when it takes too long; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def render_profiles(ctx: Context) -> list[Path]:
    """HTML and text renderings of every pyinstrument session file of the run."""
    written: list[Path] = []
    if ctx.profile_dir is None:
        return written
    for session in sorted(ctx.profile_dir.glob("*.pyisession")):
        for renderer, suffix in (("html", ".html"), ("text", ".txt")):
            target = session.with_suffix(suffix)
            done = subprocess.run(
                [sys.executable, "-m", "pyinstrument", "--load", str(session), "-r", renderer,
                 "-o", str(target)],
                capture_output=True,
                check=False,
            )  # fmt: skip
            if done.returncode == 0:
                written.append(target)
    return written


def relay_env(
    bootstrap: str, prefix: str, group: str, instance: str, **extra: object
) -> dict[str, str]:
    """``OUTBOX_RELAY_*`` for one relay instance (everything else at its defaults)."""
    return {
        "OUTBOX_RELAY_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOX_RELAY_TOPIC_PREFIX": prefix,
        "OUTBOX_RELAY_GROUP_ID": group,
        "OUTBOX_RELAY_INSTANCE_ID": instance,
        **{f"OUTBOX_RELAY_{k.upper()}": str(v) for k, v in extra.items()},
    }


def holds_partitions(log: str) -> bool:
    """A relay's log says it was assigned at least one partition."""
    return any(
        "assigned partitions [" in line and "assigned partitions []" not in line
        for line in log.splitlines()
    )


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(
    bootstrap: str, name: str, *, partitions: int = 6, config: dict[str, str] | None = None
) -> None:
    """A real topic for the promoted records (the relay never auto-creates one)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
    )
    futures[name].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topic = admin.list_topics(timeout=10).topics.get(name)
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {name} has no leaders after 30 s")
