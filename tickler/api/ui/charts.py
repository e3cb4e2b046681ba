"""Bar charts of per-minute figures, drawn on the server as inline SVG (no script, no CDN)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from markupsafe import Markup, escape

from tickler.scheduler.store.forecast import Forecast

WIDTH = 240
HEIGHT = 44  # the bars' area
_TOP = 10  # room above the tallest bar, for the scale's label
_AXIS = 11  # below the bars: the time axis' labels


def per_minute_chart(values: Sequence[int], *, now: datetime, label: str, kind: str) -> Markup:
    """Sixty bars, oldest minute on the left; `kind` picks the colour (CSS class `chart-<kind>`).

    Every bar has a <title> ("18:04 UTC: 52 delivered") that browsers show on hover; the chart's
    own title says the total and the peak, for screen readers and for a glance.
    """
    total = sum(values)
    peak = max(values, default=0)
    n = max(len(values), 1)
    step = WIDTH / n
    bar = max(step - 1, 1)
    current = now.replace(second=0, microsecond=0)
    bars = []
    for i, value in enumerate(values):
        if value <= 0:
            continue
        height = max((HEIGHT - _TOP) * value / peak, 1.5)
        minute = current - timedelta(minutes=len(values) - 1 - i)
        tip = f"{minute:%H:%M} UTC: {value} {label}"
        bars.append(
            f'<rect x="{i * step:.1f}" y="{HEIGHT - height:.1f}" width="{bar:.1f}" height="{height:.1f}">'
            f"<title>{escape(tip)}</title></rect>"
        )
    summary = f"{total} {label} in the last hour, peak {peak} a minute"
    # The scale: a line at the tallest bar with its value, and the time axis' two ends.
    scale = (
        f'<line class="scale" x1="0" y1="{_TOP - 0.5}" x2="{WIDTH}" y2="{_TOP - 0.5}"/>'
        f'<text class="scale-label" x="0" y="{_TOP - 2}">{peak}/min</text>'
        if peak
        else ""
    )
    axis = (
        f'<text class="scale-label" x="0" y="{HEIGHT + _AXIS - 1}">60 min ago</text>'
        f'<text class="scale-label" x="{WIDTH}" y="{HEIGHT + _AXIS - 1}" text-anchor="end">now</text>'
    )
    return Markup(
        f'<svg class="chart chart-{escape(kind)}" viewBox="0 0 {WIDTH} {HEIGHT + _AXIS}" width="{WIDTH}"'
        f' height="{HEIGHT + _AXIS}" role="img" aria-label="{escape(summary)}"><title>{escape(summary)}</title>'
        f'<line class="axis" x1="0" y1="{HEIGHT - 0.5}" x2="{WIDTH}" y2="{HEIGHT - 0.5}"/>'
        + scale
        + "".join(bars)
        + axis
        + "</svg>"
    )


def upcoming_chart(forecast: Forecast) -> Markup:
    """The forecast's bars (SPEC §7): pending events falling due per hour, the current hour on the
    left; each bar's <title> says its hour and count, the chart's own title the total and later."""
    values = [b.count for b in forecast.buckets]
    peak = max(values, default=0)
    step = WIDTH / max(len(values), 1)
    bar = max(step - 1, 1)
    bars = []
    for i, (start, value) in enumerate((b.start, b.count) for b in forecast.buckets):
        if value <= 0:
            continue
        height = max((HEIGHT - _TOP) * value / peak, 1.5)
        tip = f"{start:%H:%M} UTC: {value} falling due"
        bars.append(
            f'<rect x="{i * step:.1f}" y="{HEIGHT - height:.1f}" width="{bar:.1f}" height="{height:.1f}">'
            f"<title>{escape(tip)}</title></rect>"
        )
    estimate = "" if forecast.exact else " (estimated)"
    summary = f"{sum(values)} pending events falling due in the next {len(values)} hours, {forecast.later} later"
    summary += estimate
    return Markup(
        f'<svg class="chart chart-upcoming" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}"'
        f' role="img" aria-label="{escape(summary)}"><title>{escape(summary)}</title>'
        f'<line class="axis" x1="0" y1="{HEIGHT - 0.5}" x2="{WIDTH}" y2="{HEIGHT - 0.5}"/>' + "".join(bars) + "</svg>"
    )
