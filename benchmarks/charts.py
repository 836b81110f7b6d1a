"""Pictures of benchmark figures for people who would rather look than read (matplotlib)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path


def latency_histogram(runs: Sequence[tuple[str, Sequence[float]]], path: Path, title: str) -> Path:
    """One histogram of alert latencies (ms, as measured) per run, overlaid, in seconds.

    An alert that never arrived is infinitely late: it cannot be drawn, so the legend
    counts it, and the p50 / p99 lines of each run are drawn from all its alerts.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.5), dpi=110)
    finite_all = [v / 1000 for _, values in runs for v in values if math.isfinite(v)]
    top = max(finite_all, default=1.0)
    bins = [top * i / 60 for i in range(61)]
    for (name, values), colour in zip(runs, ("tab:blue", "tab:orange", "tab:green"), strict=False):
        seconds = sorted(v / 1000 for v in values)
        finite = [v for v in seconds if math.isfinite(v)]
        missing = len(seconds) - len(finite)
        label = f"{name}: {len(seconds)} alerts" + (f", {missing} never arrived" if missing else "")
        axes.hist(finite, bins=bins, alpha=0.55, color=colour, label=label)
        for q, style in ((0.5, "--"), (0.99, ":")):
            value = seconds[min(len(seconds) - 1, int(q * len(seconds)))] if seconds else math.inf
            if math.isfinite(value):
                axes.axvline(value, color=colour, linestyle=style, linewidth=1.2)
                axes.annotate(
                    f"p{int(q * 100)} {value:.2f} s",
                    (value, axes.get_ylim()[1] * (0.92 if q == 0.5 else 0.82)),
                    color=colour,
                    fontsize=8,
                    xytext=(3, 0),
                    textcoords="offset points",
                )
    axes.set_xlim(0, top * 1.18)  # room for the p99 label
    axes.set_xlabel("alert latency: event landed or produced → alert read from Redis (s)")
    axes.set_ylabel("alerts")
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path
