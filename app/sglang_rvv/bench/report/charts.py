"""PNG bar charts for the benchmark report (matplotlib, Agg backend: no display needed).

One chart is one or more panels side by side, sharing one legend; a panel is
groups of bars (``categories``), one bar per series in each group, with
optional min-max error bars. Missing values (None) leave a gap rather than a
zero bar.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless servers and CI have no display

import matplotlib.pyplot as plt  # noqa: E402


@dataclass
class Panel:
    title: str
    ylabel: str
    categories: list[str]
    series: dict[str, list[float | None]]  # label -> one value per category
    # label -> one (low, high) per category, or None for no error bar
    ranges: dict[str, list[tuple[float, float] | None]] = field(default_factory=dict)


def _short(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def bar_chart(path: Path, title: str, panels: list[Panel]) -> Path:
    # Wide enough for every group's tick label (run labels are long).
    width = sum(max(4.5, 2.2 * len(panel.categories)) for panel in panels) + 1
    figure, axes = plt.subplots(1, len(panels), figsize=(width, 4.6), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        count = max(len(panel.series), 1)
        width = 0.8 / count
        for index, (label, values) in enumerate(panel.series.items()):
            xs = [c + (index - (count - 1) / 2) * width for c in range(len(panel.categories))]
            shown = [(x, v, r) for x, v, r in zip(xs, values, panel.ranges.get(label) or [None] * len(values),
                                                  strict=True) if v is not None]
            if not shown:
                continue
            bar_x, heights, ranges = zip(*shown, strict=True)
            errors = [[v - r[0] if r else 0 for v, r in zip(heights, ranges, strict=True)],
                      [r[1] - v if r else 0 for v, r in zip(heights, ranges, strict=True)]]
            bars = ax.bar(bar_x, heights, width, label=label,
                          yerr=errors if any(ranges) else None, capsize=3)
            ax.bar_label(bars, fmt=_short, fontsize=7, padding=2)
        ax.set_xticks(range(len(panel.categories)), panel.categories, fontsize=8)
        ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(panel.ylabel)
        ax.margins(y=0.15)  # room for the value labels
    # One legend below the panels, which all show the same series: it never covers a bar.
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
