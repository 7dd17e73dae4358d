"""Charts for the console as plain numbers an SVG template draws: no script, no external
asset, rendered on the server (``templates/admin/console/chart.html``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StackedBar:
    x: float
    width: float
    ok_y: float
    ok_height: float
    failed_y: float
    failed_height: float
    label: str
    ok: int
    failed: int


@dataclass(frozen=True)
class Chart:
    title: str
    width: int
    height: int
    plot_top: int
    plot_bottom: int
    bars: list[StackedBar]
    max_value: int
    first_label: str
    last_label: str


def stacked_bars(title: str, points: Sequence[tuple[str, int, int]], *, width: int = 760,
                 height: int = 160) -> Chart:
    """One bar per ``(label, ok, failed)``: ok at the bottom, failed stacked on top, all on
    one scale (the tallest bar fills the plot)."""
    plot_top, plot_bottom = 16, height - 22
    plot_height = plot_bottom - plot_top
    tallest = max((ok + failed for _, ok, failed in points), default=0)
    slot = width / max(len(points), 1)
    gap = min(2.0, slot * 0.2)
    bars = []
    for index, (label, ok, failed) in enumerate(points):
        ok_height = ok / tallest * plot_height if tallest else 0.0
        failed_height = failed / tallest * plot_height if tallest else 0.0
        ok_y = plot_bottom - ok_height
        bars.append(StackedBar(
            x=round(index * slot + gap / 2, 2), width=round(max(slot - gap, 0.5), 2),
            ok_y=round(ok_y, 2), ok_height=round(ok_height, 2),
            failed_y=round(ok_y - failed_height, 2), failed_height=round(failed_height, 2),
            label=label, ok=ok, failed=failed))
    return Chart(title=title, width=width, height=height, plot_top=plot_top,
                 plot_bottom=plot_bottom, bars=bars, max_value=tallest,
                 first_label=points[0][0] if points else "",
                 last_label=points[-1][0] if points else "")
