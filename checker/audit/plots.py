"""Latency histograms as PNG images, for the self-contained HTML report.

matplotlib's object API with the Agg canvas: no display, no global pyplot state, safe to call
from any thread.
"""

from __future__ import annotations

import io

from checker.audit.bins import bin_edges_ms, bins_span, label_ms


def histogram_png(pairs: list[tuple[int, int]], title: str) -> bytes:
    """A bar chart of (bin, count) pairs (quarter-decade bins of ms) as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = dict(pairs)
    span = list(bins_span(pairs))
    figure = Figure(figsize=(7.0, 2.8), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    if span:
        axes.bar(range(len(span)), [counts.get(b, 0) for b in span], color="#3b6ea8", width=0.9)
        axes.set_xticks(range(len(span)))
        axes.set_xticklabels([label_ms(bin_edges_ms(b)[0]) for b in span], rotation=45, fontsize=7)
    else:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
        axes.set_xticks([])
    axes.set_title(title, fontsize=10)
    axes.set_ylabel("transactions", fontsize=8)
    axes.set_xlabel("latency (lower bin edge)", fontsize=8)
    axes.tick_params(axis="y", labelsize=7)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
