"""The README's quickstart runs as written: its Python and its shell block, against a real
broker (its address for ``localhost:9092``), with the real relay and checker; a
``read_committed`` consumer then sees the committed order's event once and the rolled-back one's
never, and the database agrees."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.kafka_helpers import unique

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def blocks(language: str, section: str) -> list[str]:
    """The ``language`` code blocks of the README section titled ``section``."""
    start = README.index(f"\n## {section}\n")
    end = README.find("\n## ", start + 1)
    text = README[start:end]
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def stop_group(group: int) -> None:
    """SIGTERM to what the block left running in the background, SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        for _ in range(100):
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def test_the_quickstart_runs_as_written(kafka_bootstrap: str, tmp_path: Path) -> None:
    run_quickstart(kafka_bootstrap, tmp_path, Path(sys.executable).parent, isolated=False)


def run_quickstart(bootstrap: str, tmp_path: Path, bin_dir: Path, *, isolated: bool) -> None:
    """The Quickstart's two blocks, with ``bin_dir``'s ``python`` and ``kafka-outbox`` first on
    the PATH (this checkout's virtualenv, or one a wheel was installed into: ``isolated``, with
    no ``PYTHONPATH`` that could bring the checkout back). The broker is this session's, shared:
    the real topic ``orders`` becomes one of this run's own, as do the outbox's topics and
    groups."""
    [python] = blocks("python", "Quickstart")
    [shell] = blocks("bash", "Quickstart")
    assert python.startswith("# quickstart.py\n") and "python quickstart.py" in shell
    topic = unique("orders")
    python = python.replace('outbox.send("orders",', f'outbox.send("{topic}",')
    shell = shell.replace("--topic orders", f"--topic {topic}")
    assert topic in python and topic in shell, "the README's topic is not where it was"
    (tmp_path / "quickstart.py").write_text(python)
    tools = tmp_path / "bin"
    tools.mkdir()
    consumer = tools / "kafka-console-consumer.sh"
    consumer.write_text(
        f'#!/bin/sh\nexec {sys.executable} {ROOT / "tests/docs/console_consumer.py"} "$@"\n'
    )
    consumer.chmod(consumer.stat().st_mode | stat.S_IXUSR)
    dropped = ("OUTBOX_", "PYTHONPATH") if isolated else ("OUTBOX_",)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(dropped)},
        # this session's broker is shared: the outbox's own topics and groups of this test alone
        "OUTBOX_TOPIC_PREFIX": unique("__outbox-readme"),
        "OUTBOX_RELAY_GROUP_ID": unique("readme-relay"),
        "OUTBOX_CHECKER_GROUP_ID": unique("readme-checker"),
        "PATH": f"{tools}:{bin_dir}:{os.environ['PATH']}",
    }
    script = shell.replace("localhost:9092", bootstrap)
    # output to files: the relay and checker the block leaves running in the background keep
    # its stdout open, and the block is done when bash is, not when they close it
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        shell_run = subprocess.Popen(
            ["bash", "-e", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,  # the background processes stay in its process group
        )
        try:
            shell_run.wait(timeout=300)
        finally:
            stop_group(shell_run.pid)
    done = subprocess.CompletedProcess(
        shell_run.args,
        shell_run.returncode,
        (tmp_path / "out").read_text(),
        (tmp_path / "err").read_text(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [line.split("\t", 1) for line in done.stdout.splitlines() if "\t" in line]
    events = [(key, json.loads(value)) for key, value in printed]
    assert [key for key, _ in events] == ["order-1"], done.stdout  # once; order-2 never
    assert events[0][1] == {"type": "OrderPlaced", "order_id": "order-1", "amount_cents": 4200}
    database = sa.create_engine(f"sqlite:///{tmp_path / 'orders.db'}")
    with database.connect() as conn:
        rows = conn.execute(sa.text("SELECT id FROM orders")).scalars().all()
    database.dispose()
    assert rows == ["order-1"]
