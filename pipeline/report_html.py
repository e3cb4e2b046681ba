"""The report as one self-contained HTML page: inline SVG charts and tables, no external resources."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from datetime import date, datetime
from html import escape
from typing import TYPE_CHECKING, Any

from pipeline.report import LATENESS_BUCKETS

if TYPE_CHECKING:
    from pipeline.report import Period

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
    legend = [(name, colors[name]) for name in series]
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


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int = 1) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"num" if i >= numeric_from else ""}">{escape(cell)}</td>' for i, cell in enumerate(row))
        + "</tr>"
        for row in rows
    )
    if not rows:
        body = f'<tr><td colspan="{len(headers)}" class="empty">nothing in this period</td></tr>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _days(period: Period) -> list[date]:
    days, day = [], period.since
    while day < period.until:
        days.append(day)
        day = date.fromordinal(day.toordinal() + 1)
    return days


def _card(label: str, value: str, note: str = "") -> str:
    return (
        f'<div class="card"><div class="label">{escape(label)}</div><div class="value">{escape(value)}</div>'
        f'<div class="note">{escape(note)}</div></div>'
    )


def render(tables: dict[str, list[dict[str, Any]]], period: Period, *, generated: datetime, source: str) -> str:
    """The whole page."""
    daily, summary = tables["daily"], tables["summary"]
    days = _days(period)
    if len(days) > 400:  # a long period: show the days that have data only
        days = sorted({row["day"] for row in daily})
    labels = [d.strftime("%b %d") for d in days]
    index = {d: i for i, d in enumerate(days)}

    volumes = {name: [0.0] * len(days) for name in OUTCOME_COLORS}
    enqueued = [0.0] * len(days)
    per_queue_volume: dict[str, float] = defaultdict(float)
    failed: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(days))
    tried: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(days))
    for row in daily:
        i = index.get(row["day"])
        if i is None:
            continue
        for name in OUTCOME_COLORS:
            volumes[name][i] += row[name]
        enqueued[i] += row["enqueued"]
        per_queue_volume[row["queue"]] += row["failed_attempts"] + row["delivered"]
        for key in (row["queue"], "all queues"):
            failed[key][i] += row["failed_attempts"]
            tried[key][i] += row["failed_attempts"] + row["delivered"]
    shown = ["all queues", *sorted(per_queue_volume, key=lambda q: -per_queue_volume[q])[:5]]
    rates = {
        name: [failed[name][i] / tried[name][i] if tried[name][i] else None for i in range(len(days))]
        for name in shown
        if name in tried
    }

    histogram = [0] * len(LATENESS_BUCKETS)
    for row in tables["lateness_histogram"]:
        histogram[row["bucket"]] += row["deliveries"]
    used = [i for i, n in enumerate(histogram) if n] or [1]
    # every bucket from the first to the last one used, so the shape reads right
    buckets = [(LATENESS_BUCKETS[i][0], histogram[i]) for i in range(min(used), max(used) + 1)]

    total_delivered = sum(r["delivered"] for r in summary)
    total_failed = sum(r["failed_attempts"] for r in summary)
    total_dead = sum(r["dead"] for r in summary)
    worst_p95 = max((r["lateness_p95_s"] for r in summary if r["lateness_p95_s"] is not None), default=None)
    cards = "".join(
        [
            _card("delivered", number(total_delivered)),
            _card(
                "failure rate",
                percent(total_failed / (total_failed + total_delivered)) if total_failed + total_delivered else "-",
                f"{number(total_failed)} failed attempts",
            ),
            _card("dead", number(total_dead)),
            _card("lateness p95", seconds(worst_p95), "worst queue"),
        ]
    )

    summary_rows = [
        [
            r["queue"], number(r["enqueued"]), number(r["rescheduled"]), number(r["delivered"]),
            number(r["cancelled"]), number(r["dead"]), percent(r["failure_rate"]), number(r["lease_expired"]),
            seconds(r["lateness_p50_s"]), seconds(r["lateness_p95_s"]), seconds(r["lateness_p99_s"]),
            number(r["attempts_avg"]), percent(r["redelivered_share"]), seconds(r["enqueue_to_delivery_p50_s"]),
        ]
        for r in summary
    ]  # fmt: skip
    summary_table = _table(
        ["queue", "enqueued", "rescheduled", "delivered", "cancelled", "dead", "failure rate", "expiries",
         "late p50", "p95", "p99", "attempts", "redelivered", "enqueued→delivered p50"],
        summary_rows,
    )  # fmt: skip
    groups = [r for r in tables["top_failures"] if r["kind"] == "group"]
    principals = [r for r in tables["top_failures"] if r["kind"] == "principal"]
    group_table = _table(
        ["queue", "group", "failed attempts", "events"],
        [[r["queue"], r["name"], number(r["failures"]), number(r["events"])] for r in groups],
        numeric_from=2,
    )
    principal_table = _table(
        ["principal", "failed attempts", "events"],
        [[r["name"], number(r["failures"]), number(r["events"])] for r in principals],
    )
    title = f"tickler delivery report, {period.since.isoformat()} to {period.until.isoformat()}"
    volume_chart = stacked_bars(labels, volumes, ("enqueued", enqueued), OUTCOME_COLORS, "daily volumes")
    lateness_chart = stacked_bars(
        [b[0] for b in buckets], {"delivered": [float(b[1]) for b in buckets]}, None,
        {"delivered": OUTCOME_COLORS["delivered"]}, "lateness distribution",
    )  # fmt: skip
    rate_chart = lines(labels, rates, percent, "failure rate per day", y_floor=0.05)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1080px; color: #212121; padding: 0 16px; }}
h1 {{ font-size: 22px; margin-bottom: 4px; }} h2 {{ font-size: 17px; margin-top: 32px; }}
.meta {{ color: #666; font-size: 13px; }}
.cards {{ display: flex; gap: 12px; margin: 20px 0; flex-wrap: wrap; }}
.card {{ border: 1px solid #e0e0e0; border-radius: 8px; padding: 12px 16px; min-width: 180px; }}
.card .label {{ color: #666; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }}
.card .value {{ font-size: 26px; font-weight: 600; }} .card .note {{ color: #888; font-size: 12px; }}
.legend {{ font-size: 12px; color: #444; margin: 4px 0 0 {LEFT}px; }}
.key {{ margin-right: 16px; }} .key i {{ display: inline-block; width: 10px; height: 10px; margin-right: 4px; }}
table {{ border-collapse: collapse; font-size: 13px; width: 100%; }}
th, td {{ padding: 4px 8px; border-bottom: 1px solid #eee; text-align: left; white-space: nowrap; }}
th {{ background: #fafafa; font-weight: 600; }} td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
td.empty {{ color: #888; font-style: italic; }} .grid {{ display: grid; grid-template-columns: 1fr 1fr; gap: 24px; }}
.wide {{ overflow-x: auto; }} p.help {{ color: #666; font-size: 13px; margin-top: 0; }}
</style></head><body>
<h1>{escape(title)}</h1>
<div class="meta">Days in UTC, {escape(period.since.isoformat())} included to {escape(period.until.isoformat())}
excluded. Generated {escape(generated.strftime("%Y-%m-%d %H:%M UTC"))} from the live tables and the archive
(read via {escape(source)}).</div>
<div class="cards">{cards}</div>
<h2>Daily volumes by outcome</h2>
<p class="help">Events finished each day by outcome (bars) and events enqueued (line), all queues.</p>
{volume_chart}
<h2>Lateness of deliveries</h2>
<p class="help">Delivered time minus the schedule the client last asked for; retries count against it.</p>
{lateness_chart}
<h2>Failure rate per day</h2>
<p class="help">Failed attempts (failures, lease expiries, dead verdicts) over attempts with a verdict.</p>
{rate_chart}
<h2>Queues</h2>
<p class="help">The whole period. Lateness is nearest-rank; attempts = redeliveries + 1, per delivered event;
expiries are leases that ran out; redelivered = share of deliveries that needed more than one attempt.</p>
<div class="wide">{summary_table}</div>
<div class="grid"><div><h2>Groups with the most failures</h2>{group_table}</div>
<div><h2>Principals with the most failures</h2>{principal_table}</div></div>
</body></html>
"""
