"""The Podman API service the harness starts outlives the checkout that started it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from outbox.testing import engine
from outbox.testing.settings import HarnessSettings

#: Stands in for ``podman system service``: notes its working directory, answers one ping.
FAKE_PODMAN = """#!{python}
import os, socket, sys
path = sys.argv[-1].removeprefix("unix://")
with open({record!r}, "w") as out:
    out.write(os.getcwd())
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(1)
conn, _ = server.accept()
conn.recv(1024)
conn.sendall(b"HTTP/1.0 200 OK\\r\\n\\r\\nOK")
conn.close()
"""


def test_the_podman_service_does_not_work_in_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The service is reused by later sessions; runc inherits its working directory and cannot
    # start containers once that directory is deleted (reproduced with podman 4.3 / runc).
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    record = tmp_path / "service-cwd"
    fake = tmp_path / "podman"
    fake.write_text(FAKE_PODMAN.format(python=sys.executable, record=str(record)))
    fake.chmod(0o755)
    settings = HarnessSettings(cache_dir=tmp_path / "cache")
    (settings.cache_dir / "podman").mkdir(parents=True)

    engine._start_podman_service(str(fake), tmp_path / "run" / "podman.sock", settings)

    assert record.read_text() == "/"
