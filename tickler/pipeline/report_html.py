"""The report as one self-contained HTML page: inline SVG charts and tables, no external resources."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import date, datetime
from html import escape
from typing import Any

from tickler.pipeline.period import LATENESS_BUCKETS, Period
from tickler.pipeline.report_charts import (
    LEFT,
    OUTCOME_COLORS,
    SERIES_COLORS,
    lines,
    number,
    percent,
    seconds,
    stacked_bars,
)

__all__ = ["percent", "render", "seconds"]

MAX_ATTEMPTS_SHOWN = 10  # the attempts chart puts 10 and more in one bar


def _lateness_shares(
    histogram: Sequence[dict[str, Any]], buckets: Sequence[tuple[str, int]]
) -> dict[str, list[float | None]]:
    """Per queue (the five with most deliveries): the share of its deliveries in each shown bucket."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in histogram:
        counts[row["queue"]][row["label"]] += row["deliveries"]
    totals = {q: float(sum(c.values())) for q, c in counts.items()}
    return {q: [counts[q][label] / totals[q] for label, _ in buckets] for q in _top(totals)}


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


def _top(totals: dict[str, float], limit: int = 5) -> list[str]:
    """The queues with the largest totals, largest first; queues with nothing are left out."""
    return sorted((q for q, n in totals.items() if n > 0), key=lambda q: (-totals[q], q))[:limit]


def _stacked_by_queue(
    rows: Sequence[dict[str, Any]], x_of: Any, value: str, xs: Sequence[Any]
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Series per queue (the five largest, then "other queues") over `xs`, and their colors."""
    totals: dict[str, float] = defaultdict(float)
    for row in rows:
        totals[row["queue"]] += row[value] or 0
    shown = _top(totals)
    position = {x: i for i, x in enumerate(xs)}
    series: dict[str, list[float]] = {q: [0.0] * len(xs) for q in [*shown, "other queues"]}
    for row in rows:
        i = position.get(x_of(row))
        if i is not None and row[value]:
            series[row["queue"] if row["queue"] in shown else "other queues"][i] += row[value]
    colors = {q: SERIES_COLORS[1 + n % (len(SERIES_COLORS) - 1)] for n, q in enumerate(shown)}
    colors["other queues"] = "#bdbdbd"
    return series, colors


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
    shown = ["all queues", *_top(per_queue_volume)]
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
    hours = list(range(24))
    hourly_series, hourly_colors = _stacked_by_queue(tables["hourly"], lambda r: r["hour"], "delivered", hours)
    enqueued_by_hour = [float(sum(r["enqueued"] for r in tables["hourly"] if r["hour"] == h)) for h in hours]
    hour_labels = [f"{h:02d}:00" for h in hours]
    hourly_chart = stacked_bars(
        hour_labels, hourly_series, ("enqueued", enqueued_by_hour), hourly_colors, "throughput by hour"
    )
    lateness_queue_chart = lines(
        [b[0] for b in buckets], _lateness_shares(tables["lateness_histogram"], buckets), percent,
        "lateness per queue", y_floor=0.1,
    )  # fmt: skip
    attempts_rows = [{**r, "attempts": min(int(r["attempts"] or 1), MAX_ATTEMPTS_SHOWN)}
                     for r in tables["attempts_histogram"]]  # fmt: skip
    most = max((r["attempts"] for r in attempts_rows), default=1)
    attempt_xs = list(range(1, most + 1))
    attempts_series, attempts_colors = _stacked_by_queue(
        attempts_rows, lambda r: r["attempts"], "deliveries", attempt_xs
    )
    attempts_chart = stacked_bars(
        [f"{n}+" if n == MAX_ATTEMPTS_SHOWN else str(n) for n in attempt_xs], attempts_series, None, attempts_colors,
        "attempts per delivered event",
    )  # fmt: skip
    dead_total: dict[str, int] = defaultdict(int)
    for r in tables["dead_reasons"]:
        dead_total[r["queue"]] += r["dead"]
    dead_table = _table(
        ["queue", "reason", "dead events", "share of the queue's dead"],
        [[r["queue"], r["reason"], number(r["dead"]), percent(r["dead"] / dead_total[r["queue"]])]
         for r in tables["dead_reasons"]],
        numeric_from=2,
    )  # fmt: skip
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
table {{ border-collapse: collapse; font-size: 12px; width: 100%; }}
th, td {{ padding: 4px 5px; border-bottom: 1px solid #eee; text-align: left; }}
td.num {{ white-space: nowrap; }} th {{ vertical-align: bottom; }}
td:first-child {{ overflow-wrap: anywhere; min-width: 7em; }}
th {{ background: #fafafa; font-weight: 600; }} td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
td.empty {{ color: #888; font-style: italic; }} .grid {{ display: grid; grid-template-columns: 1fr 1fr; gap: 24px; }}
p.help {{ color: #666; font-size: 13px; margin-top: 0; }}
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
<h2>Lateness per queue</h2>
<p class="help">Share of each queue's deliveries in each lateness bucket (the five busiest queues).</p>
{lateness_queue_chart}
<h2>Throughput by hour of day</h2>
<p class="help">Deliveries per hour of the day (UTC) over the whole period, by queue (bars), and events
enqueued (line).</p>
{hourly_chart}
<h2>Attempts per delivered event</h2>
<p class="help">How many attempts delivered events needed (redeliveries + 1), by queue.</p>
{attempts_chart}
<h2>Failure rate per day</h2>
<p class="help">Failed attempts (failures, lease expiries, dead verdicts) over attempts with a verdict.</p>
{rate_chart}
<h2>Queues</h2>
<p class="help">The whole period. Lateness is nearest-rank; attempts = redeliveries + 1, per delivered event;
expiries are leases that ran out; redelivered = share of deliveries that needed more than one attempt.</p>
{summary_table}
<h2>Dead events by queue and reason</h2>
<p class="help">Events that ended dead in the period, by the reason their <code>dead</code> entry gives.</p>
{dead_table}
<div class="grid"><div><h2>Groups with the most failures</h2>{group_table}</div>
<div><h2>Principals with the most failures</h2>{principal_table}</div></div>
</body></html>
"""
