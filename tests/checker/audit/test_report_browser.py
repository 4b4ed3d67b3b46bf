"""The seeded audit's HTML report, opened in headless Chromium: tables and plots render."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import pytest

from checker.audit.findings import FINDINGS
from tests.checker.audit.browser import Browser, find_chromium
from tests.checker.audit.conftest import SeededAudit

pytestmark = pytest.mark.integration

PAGE_FACTS = """JSON.stringify({
  title: document.title,
  verdict: document.getElementById('verdict').textContent,
  findingTables: document.querySelectorAll('table.finding').length,
  findingRows: document.querySelectorAll('table.finding tr').length,
  sections: document.querySelectorAll('h2[id^="finding-"]').length,
  images: Array.from(document.images).map(i => [i.id, i.complete, i.naturalWidth, i.naturalHeight]),
  height: document.documentElement.scrollHeight
})"""


@pytest.fixture
def browser() -> Iterator[Browser]:
    executable = find_chromium()
    if executable is None:
        message = "chromium is not installed (scripts/install-system-packages.sh installs it)"
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    running = Browser(executable)
    yield running
    running.close()


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_report_renders_its_tables_and_images_without_console_errors(
    seeded_audit: SeededAudit, browser: Browser, tmp_path
) -> None:
    import json

    browser.open(seeded_audit.result.report_path.resolve().as_uri())
    facts = json.loads(browser.evaluate(PAGE_FACTS))
    shot = browser.screenshot()
    (tmp_path / "report.png").write_bytes(shot)

    assert facts["title"] == "kafka-outbox audit"
    assert facts["verdict"].startswith("VIOLATIONS")
    assert facts["sections"] == len(FINDINGS)
    assert facts["findingTables"] == len(FINDINGS)  # the seeded audit has rows in every one
    assert facts["findingRows"] > 2 * len(FINDINGS)
    assert len(facts["images"]) == 3
    for ident, complete, width, height in facts["images"]:
        assert complete and width > 100 and height > 100, ident
    width, height = png_size(shot)
    assert width >= 800 and height >= 1000 and len(shot) > 50_000
    assert browser.errors() == []
