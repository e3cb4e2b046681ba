"""Inline SVG charts and number formats for the report page (no scripts, nothing fetched)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

OUTCOME_COLORS = {"delivered": "#2e7d32", "cancelled": "#9e9e9e", "dead": "#c62828"}
ENQUEUED_COLOR = "#1565c0"
SERIES_COLORS = ("#1565c0", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#558b2f", "#4e342e", "#37474f")
WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 48


def seconds(value: float | None) -> str:
    """A duration for people: 850 ms, 12.3 s, 4.2 min, 1.5 h, 2.1 d."""
    if value is None:
        return "-"
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value < 1:
        return f"{sign}{value * 1000:.0f} ms"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if value >= size:
            return f"{sign}{value / size:.1f} {unit}"
    return f"{sign}{value:.1f} s"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def number(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def tick(value: float) -> str:
    """An axis label: 2.5, 10, 1,500."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _nice_max(value: float) -> float:
    """A round axis maximum at or above `value`."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    return float(next(step * magnitude for step in (1, 2, 2.5, 5, 10) if step * magnitude >= value * (1 - 1e-9)))


def _frame(y_max: float, y_label: Any, x_labels: Sequence[str], title: str) -> list[str]:
    """The SVG start, y grid lines with labels and x labels (thinned to fit)."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" aria-label="{escape(title)}" '
        'xmlns="http://www.w3.org/2000/svg" font-family="system-ui, sans-serif" font-size="11">'
    ]
    for i in range(5):
        value = y_max * i / 4
        y = TOP + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{y_label(value)}</text>')
    n = max(1, len(x_labels))
    every = max(1, -(-n * 64 // plot_w))  # at most one label per 64 px
    for i, label in enumerate(x_labels):
        if i % every:
            continue
        x = LEFT + plot_w * (i + 0.5) / n
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle" fill="#555">{escape(label)}</text>'
        )
    return parts


def _legend(items: Sequence[tuple[str, str]]) -> str:
    spans = "".join(
        f'<span class="key"><i style="background:{color}"></i>{escape(label)}</span>' for label, color in items
    )
    return f'<div class="legend">{spans}</div>'


def stacked_bars(
    x_labels: Sequence[str],
    series: dict[str, list[float]],
    line: tuple[str, list[float]] | None,
    colors: dict[str, str],
    title: str,
) -> str:
    """Bars stacked per x (one per series), with an optional line on the same axis."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    totals = [sum(values[i] for values in series.values()) for i in range(len(x_labels))]
    peak = max([*totals, *(line[1] if line else [])], default=0)
    y_max = _nice_max(peak)
    parts = _frame(y_max, tick, x_labels, title)
    n = max(1, len(x_labels))
    bar_w = plot_w / n * 0.7
    for i in range(len(x_labels)):
        base = 0.0
        x = LEFT + plot_w * (i + 0.5) / n - bar_w / 2
        for name, values in series.items():
            value = values[i]
            if value <= 0:
                continue
            h = plot_h * value / y_max
            y = TOP + plot_h - plot_h * base / y_max - h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" fill="{colors[name]}">'
                f"<title>{escape(x_labels[i])} {escape(name)}: {number(value)}</title></rect>"
            )
            base += value
    if line is not None:
        name, values = line
        points = " ".join(
            f"{LEFT + plot_w * (i + 0.5) / n:.1f},{TOP + plot_h - plot_h * v / y_max:.1f}" for i, v in enumerate(values)
        )
        parts.append(f'<polyline points="{points}" fill="none" stroke="{ENQUEUED_COLOR}" stroke-width="2"/>')
    parts.append("</svg>")
    legend = [(name, colors[name]) for name, values in series.items() if any(v > 0 for v in values)]
    if line is not None:
        legend.append((line[0], ENQUEUED_COLOR))
    return "".join(parts) + _legend(legend)


def lines(
    x_labels: Sequence[str], series: dict[str, list[float | None]], y_label: Any, title: str, y_floor: float = 0.0
) -> str:
    """One line per series (None: no point that day)."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    peak = max((v for values in series.values() for v in values if v is not None), default=0.0)
    y_max = _nice_max(max(peak, y_floor))
    parts = _frame(y_max, y_label, x_labels, title)
    n = max(1, len(x_labels))
    legend = []
    for index, (name, values) in enumerate(series.items()):
        color = SERIES_COLORS[index % len(SERIES_COLORS)]
        if all(v is None for v in values):
            continue  # nothing to draw: no legend entry either
        legend.append((name, color))
        points = [
            (LEFT + plot_w * (i + 0.5) / n, TOP + plot_h - plot_h * v / y_max, v)
            for i, v in enumerate(values)
            if v is not None
        ]
        if len(points) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in points)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y, v in points:
            parts.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"><title>{escape(name)}: '
                f"{y_label(v)}</title></circle>"
            )
    parts.append("</svg>")
    return "".join(parts) + _legend(legend)
