"""docs/benchmarks.json (the rows of each scenario's last run) and docs/benchmarks.md, the page written
from it: how the figures are measured, then one table per scenario family."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import time
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psycopg

from bench.cluster import SETTINGS
from bench.harness import ROOT, Row

RESULTS = ROOT / "docs" / "benchmarks.json"
DOC = ROOT / "docs" / "benchmarks.md"
PEER = "pgqueuer"
SIDES = ("tickler", "peer", "baseline")

# (title, how its rows are measured, its scenarios): one table each, in this order.
FAMILIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Scheduling over HTTP",
        "tickler's API under gunicorn (2 processes) on a migrated database; keep-alive client processes "
        "post one event per request (4 clients) or batches (1 client), events an hour ahead. Conflict rows "
        "post the keys of open events again with the `on_conflict` named. Baseline: single-row `INSERT ... "
        "ON CONFLICT DO NOTHING` on one connection; for batches `COPY` into a temporary table, then one "
        "`INSERT ... ON CONFLICT` (`DO UPDATE` for replace and debounce). CPU: the server's processes and "
        "the database's backends, not the clients.",
        ("schedule_http", "schedule_batch"),
    ),
    (
        "Claim, deliver, finish",
        "N events made due at one instant; tickler worker processes (the Worker with a no-op in-process "
        "handler) claim, deliver and finish them: events/s from the due instant to the last finish "
        "(database clock). Baseline: as many processes looping over a `FOR UPDATE SKIP LOCKED` claim of "
        "the batch size and one completing `UPDATE` per batch; for groups, an advisory-lock claim of whole "
        "groups.",
        ("claim", "groups"),
    ),
    (
        "Pull consumers",
        "Consumer processes over HTTP against gunicorn: `POST /v1/queues/{q}/claims` (limit 100), then one "
        "`POST /v1/leases/ack` for the batch, until the queue is empty. Baseline: the same round trips in "
        "SQL (claim 100, one completing `UPDATE`).",
        ("pull_http",),
    ),
    (
        "Webhook delivery",
        "One worker delivers due events as signed POSTs to a local receiver (asyncio, keep-alive, 204) that "
        "answers at once; to the receiver that answers after 250 ms, `tickler serve` with its defaults "
        "delivers them (a dispatcher in each of its two web processes). Baseline: one loop that claims 100, "
        "POSTs each event signed over a keep-alive pool and completes the batch.",
        ("webhook",),
    ),
    (
        "Lateness",
        "A producer schedules events 0.25 s ahead at a steady rate for one worker; lateness is the "
        "handler's start (wall clock) minus the due time (database clock, the offset measured and "
        "subtracted), after a 5 s warm-up. Baseline: one process polling the plain claim, sleeping until "
        "the next due time (at most 50 ms).",
        ("lateness",),
    ),
    (
        "Beside pgqueuer and awa-pg",
        f"The same work through {PEER}'s public API (bench/pgq.py: its own schema installer, "
        "`SyncQueries.enqueue` with a dedupe key standing for tickler's key, `QueueManager` workers with an "
        "async no-op entrypoint) in a database of its own, in the same run. Every event has the shape a keyed, "
        "grouped producer writes, on every side: its own key, a group out of 1,000 (pgqueuer has no groups), "
        'the payload `{"i": n, "pad": <64 characters>}`, and tickler\'s `on_conflict` `ignore`. Enqueue '
        "in-process, one event per transaction or one batch of 1,000 per statement; drains of 20,000 events "
        "due at one instant (a claim of tickler and the baseline takes whole groups, pgqueuer's takes jobs); p99 "
        "lateness in the steady state (the first 5 s and the last 1 s of due times left out). awa-pg "
        "(bench/awa_peer.py: `Client.migrate()` and `install_queue_storage()`, then `enqueue_many_copy` with "
        "`unique_opts` by arguments, the group as its `ordering_key`) is in the batch row only: its workers run "
        "in its Rust runtime, which bench/ does not drive yet, and without its queue-storage backend its COPY "
        "enqueue refuses to run (its older `insert_many_copy` wrote about 1,000 jobs/s here). A batch holding a "
        "key an open awa job has fails whole (awa has no `ignore`); the batches hold new keys only.",
        ("peers",),
    ),
    (
        "Pipeline (Spark)",
        "`python -m bench.pipeline_bench` (needs pyspark and Java; not part of `python -m bench`): Spark in "
        "local mode against the same PostgreSQL over JDBC. The import of a generated CSV (every row checked, "
        "on_conflict reject) and its two parts alone, each beside a plain `COPY` of the same file into a copy of "
        "tickler_event with its indexes (the baseline column); the report over 30 days of history; the archive.",
        ("pipeline",),
    ),
)
KNOWN = [name for _, _, names in FAMILIES for name in names]


# -- the results file --------------------------------------------------------------------------------


def load() -> dict[str, Any]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def save(results: dict[str, Any], path: Path = RESULTS) -> None:
    """One scenario's run a line, then one line per row: small diffs when a scenario is rerun."""
    parts = []
    for name, entry in results.items():
        head = json.dumps({**{k: v for k, v in entry.items() if k != "rows"}, "rows": []}, ensure_ascii=False)
        rows = ",\n  ".join(json.dumps(_rounded(row), ensure_ascii=False) for row in entry["rows"])
        parts.append(f" {json.dumps(name)}: {head[:-3]}[\n  {rows}\n ]}}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{\n" + ",\n".join(parts) + "\n}\n")


def record(
    rows: list[Row], seconds: float, *, machine: str, server: str, cluster: str, load: Any, note: Any
) -> dict[str, Any]:
    """A scenario's entry in the results: its rows and what it ran on (runs may be days and commits apart)."""
    return {
        "at": time.strftime("%Y-%m-%d %H:%M"),
        "seconds": round(seconds, 1),
        "commit": git_head(),
        "cluster": cluster,
        "server": server,
        "machine": machine,
        "load": load,
        "note": note,
        "rows": [asdict(row) for row in rows],
    }


# -- what a run ran on -------------------------------------------------------------------------------

# The settings that move results, recorded with each run.
RUN_SETTINGS = ["autovacuum", "synchronous_commit", "fsync", "max_wal_size", "checkpoint_timeout", "shared_buffers"]
PACKAGES = ("psycopg", "SQLAlchemy", "Flask", "gunicorn", "pgqueuer", "awa-pg")


def run_settings(admin_url: str) -> str:
    with psycopg.connect(admin_url) as conn:
        found = conn.execute(
            "SELECT name, setting || coalesce(' ' || unit, '') FROM pg_settings WHERE name = ANY(%s)", (RUN_SETTINGS,)
        ).fetchall()
    return ", ".join(f"{k} = {v}" for k, v in sorted(found))


def git_head() -> str:
    try:
        run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    except OSError:
        return ""
    return run.stdout.strip()


def machine(admin_url: str, *extra: str) -> str:
    """The box, the server's version and the versions of what ran, in one line."""
    found: dict[str, str] = {}  # the first value of each key of /proc/meminfo and /proc/cpuinfo
    for path in ("/proc/meminfo", "/proc/cpuinfo"):
        with contextlib.suppress(OSError):
            for line in Path(path).read_text().splitlines():
                key, _, value = line.partition(":")
                found.setdefault(key.strip(), value.strip())
    mem_gib = int(found.get("MemTotal", "0").split()[0]) / 1024**2
    with psycopg.connect(admin_url) as conn:
        pg = conn.execute("SHOW server_version").fetchone()
    packages = [f"Python {platform.python_version()}"]
    for package in PACKAGES:
        with contextlib.suppress(PackageNotFoundError):
            packages.append(f"{package} {version(package)}")
    system = f"{platform.system()} {platform.release().split('-')[0]}"
    box = (
        f"{os.cpu_count()} cores ({found.get('model name') or platform.machine()}), {mem_gib:.1f} GiB memory, {system}"
    )
    return "; ".join([box, f"PostgreSQL {pg[0] if pg else '?'}", *extra, ", ".join(packages)])


# -- the page ----------------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return f"{text} {unit}".strip()


def _cpu(row: Row, sides: tuple[str, ...]) -> str:
    cells = [row.cpu.get(side) for side in sides]
    return " / ".join("—" if not value else f"{value[0]:,.0f} + {value[1]:,.0f}" for value in cells)


def table(rows: list[Row]) -> str:
    """A markdown table of rows; the peer, target and CPU columns only when a row has them."""
    peer = any(row.peer is not None for row in rows)
    others = sorted({name for row in rows for name in row.others})
    targets = any(row.target not in ("", "-") for row in rows)
    sides = tuple(side for side in (*SIDES, *others) if any(side in row.cpu for row in rows))
    head = ["case", "tickler", *([PEER] if peer else []), *others, "baseline", "ratio"]
    head += [*([f"{PEER} ratio"] if peer else []), *(f"{name} ratio" for name in others)]
    head += ["target", "met?"] if targets else []
    head += [f"CPU µs/event (app + db): {' / '.join(PEER if s == 'peer' else s for s in sides)}"] if sides else []
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1 - 2 * targets - bool(sides))]
    lines[1] += "---|---|" * targets + "---|" * bool(sides)
    for row in rows:
        case = row.scenario.split(": ", 1)[1] if row.scenario.startswith(("peers: ", "pipeline: ")) else row.scenario
        cells = [case + (f" ({row.note})" if row.note else ""), _fmt(row.tickler, row.unit)]
        cells += [_fmt(row.peer, row.unit)] if peer else []
        cells += ["—" if row.others.get(name) is None else _fmt(row.others[name], row.unit) for name in others]
        cells += [_fmt(row.baseline, row.unit), f"{row.ratio:.2f}" if row.ratio is not None else "—"]
        cells += [f"{row.peer / row.baseline:.2f}" if row.peer is not None and row.baseline else "—"] if peer else []
        cells += [
            f"{row.others[name] / row.baseline:.2f}" if row.others.get(name) and row.baseline else "—"
            for name in others
        ]
        cells += [row.target, {True: "yes", False: "**no**", None: "-"}[row.met]] if targets else []
        cells += [_cpu(row, sides)] if sides else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _run(name: str, entry: dict[str, Any], shared_server: bool) -> str:
    """A scenario's run, in one line (its server settings when the runs do not share them)."""
    where = {"local": "the local server"}.get(entry.get("cluster", ""), "the private cluster")
    text = f"- `{name}`: {entry['at']}" + (f" at {entry['commit']}" if entry.get("commit") else "")
    text += f", {entry['seconds']:.0f} s on {where}" if entry.get("seconds") else f" on {where}"
    if entry.get("server") and not shared_server:
        text += f" ({entry['server']})"
    if entry.get("load"):
        text += f", load average {entry['load'][0]:.1f}\N{EN DASH}{entry['load'][1]:.1f}"
    return text + (f"; {entry['note']}" if entry.get("note") else "")


def page(results: dict[str, Any]) -> str:
    servers = {entry.get("server") for name, entry in results.items() if name != "pipeline"} - {None, ""}
    machines: dict[str, list[str]] = {}
    for name, entry in results.items():
        machines.setdefault(entry.get("machine") or "not recorded", []).append(f"`{name}`")
    settings = ", ".join(f"{k} {v}" for k, v in SETTINGS.items())
    parts = [
        "# Benchmarks",
        "",
        "Written by `python -m bench` (bench/report.py) from docs/benchmarks.json, which keeps the rows of the "
        "last run of each scenario; every run rewrites both.",
        "",
        "## Method",
        "",
        "- **Same box, same run.** Each scenario runs on a fresh database of a PostgreSQL cluster started for "
        f"the run (bench/cluster.py: initdb into a temporary directory; {settings}), on the machine that also "
        "runs the clients, API servers and workers, over TCP 127.0.0.1. A row's figure is the median of its "
        "repeats (3 in a full run).",
        "- **Baseline.** In the same run and database, plain psycopg doing the same work with the best SQL we "
        "know (bench/baseline.py): one table with the same open-key rule and claim indexes, and nothing else "
        "(no timeline, counters, leases or history). It is the floor the database sets for that work on this "
        "box, not a competitor.",
        "- **ratio** = tickler / baseline: for events/s higher is better (1.00 is as fast as the plain SQL); "
        f"for ms lower is better. **{PEER} ratio** = {PEER} / baseline, in the family beside {PEER}.",
        "- **CPU µs/event (app + db)**: user + system CPU (/proc) of the side's own processes (workers, API "
        "servers, in-process clients; not load generators) and of the PostgreSQL backends serving its "
        "database, divided by the events (bench/cpu.py).",
        "- **target / met?**: what the row is held to, and whether its median meets it.",
        "- **Runs**, under each table: when each scenario last ran, at which commit, on which server, and the "
        "1-minute load average meanwhile (on a shared box a high load lowers both sides' rates).",
        *([f"- **Server settings** of the runs: {next(iter(servers))}."] if len(servers) == 1 else []),
        *[f"- **Machine** of {', '.join(names)}: {text}." for text, names in machines.items()],
        "",
        "Run it: `make bench` (installs the `bench` extra with pgqueuer, then `python -m bench`: every scenario "
        "on a private cluster, about half an hour); `python -m bench --only claim lateness` reruns some scenarios "
        "and keeps the others' rows; `--quick` runs tiny sizes on the local server and writes nothing (CI: "
        "`make bench-quick`); `--output PATH` writes a trial run's page and rows to PATH and PATH.json instead, "
        "leaving docs/ as it is; `--report-only` rewrites this page from docs/benchmarks.json. `python -m "
        "bench.walprofile` prints the WAL of a delivered event by record type, beside the baseline's "
        "(pg_waldump).",
    ]
    shared_server = len(servers) == 1
    for title, text, scenarios in FAMILIES:
        present = [name for name in scenarios if name in results]
        rows = [Row(**row) for name in present for row in results[name]["rows"]]
        parts += ["", f"## {title}", "", text, ""]
        parts += [table(rows), "", "Runs:", "", *(_run(n, results[n], shared_server) for n in present)] if rows else []
        parts += [] if rows else ["Not measured yet."]
    return "\n".join(parts) + "\n"


def write(results: dict[str, Any], path: Path = DOC) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(results))
