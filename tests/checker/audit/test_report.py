"""The HTML report: self-contained, escaped, every finding and plot in it."""

from __future__ import annotations

import re

from checker.audit.bins import bin_edges_ms, bin_index, bins_span, label_ms
from checker.audit.findings import FINDINGS
from checker.audit.plots import histogram_png
from checker.audit.report import FindingTable, format_value, render

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def summary(verdict: str = "violations") -> dict:
    return {
        "verdict": verdict,
        "violations": 1,
        "findings": {name: {"count": 1 if name == "lost" else 0} for name in FINDINGS},
        "parameters": {"from": "earliest", "real_topics": ["orders"]},
        "statistics": {"transactions": 3, "by_state": {"COMMIT": 3}},
        "latency_ms": {
            "half_to_decision": {"count": 3, "p50": 20, "p90": 40, "p99": 41, "max": 41}
        },
    }


def test_the_page_holds_the_finding_rows_escaped_and_the_plots_inline() -> None:
    table = FindingTable(
        ["txn_id", "first_half_ms", "real_topics"], [["<b>x</b>", 1795000000000, ["a", "b"]]], 1
    )
    png = histogram_png([(5, 3), (7, 1)], "half -> decision")
    page = render(summary(), {"lost": table}, {"half_to_decision": png})
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert "2026-11-18T" in page  # a *_ms timestamp shown as UTC time
    assert "a, b" in page
    assert page.count("data:image/png;base64,") == 1
    assert 'id="table-lost"' in page
    for name in FINDINGS:
        assert f'id="finding-{name}"' in page
    assert not re.search(r"""(src|href)=["']https?://""", page), "must not load anything"
    assert "<script" not in page


def test_a_clean_verdict_says_so() -> None:
    page = render(summary("clean"), {}, {})
    assert "CLEAN" in page and 'class="verdict clean"' in page


def test_histograms_are_png_images_even_without_data() -> None:
    assert histogram_png([(1, 2)], "t").startswith(PNG_MAGIC)
    assert histogram_png([], "t").startswith(PNG_MAGIC)


def test_values_are_formatted_for_people() -> None:
    assert format_value("decision_ms", 1_795_000_000_000) == "2026-11-18T11:06:40.000Z"
    assert format_value("age_ms", 90_000) == "1.5min"
    assert format_value("key", b"k\xff") == "k\\xff"
    assert format_value("records", [{"topic": "t", "offset": 3}]) == "topic=t offset=3"
    assert format_value("x", None) == ""


def test_bins_are_quarter_decades_of_milliseconds() -> None:
    assert bin_index(0) == 0 and bin_index(-5) == 0
    assert bin_index(1) == 1 and bin_index(10) == 5 and bin_index(999) == 12
    low, high = bin_edges_ms(bin_index(250))
    assert low <= 250 < high
    assert list(bins_span([(2, 1), (5, 1)])) == [2, 3, 4, 5]
    assert label_ms(250) == "250ms" and label_ms(1800) == "1.8s" and label_ms(7_200_000) == "2h"
