"""docs/benchmarks.md: the table, the machine, the versions; the pipeline section is kept as it is."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psycopg

from bench import scaling_doc
from bench.harness import ROOT, Context, Row

# The blocks bench/pipeline_bench.py writes (the whole run; the import against COPY alone): a
# rewrite of this file keeps them as they are.
PIPELINE_BLOCKS = (
    ("<!-- pipeline-figures:begin -->", "<!-- pipeline-figures:end -->"),
    ("<!-- import-figures:begin -->", "<!-- import-figures:end -->"),
)
ANALYSIS = Path(__file__).with_name("analysis.md")


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


SIDES = ("tickler", "peer", "baseline")
PEER = "pgqueuer"


def _cpu(row: Row) -> str:
    """CPU µs/event (app + db) per side, "—" for a side not measured."""
    if not row.cpu:
        return "-"
    cells = []
    for side in SIDES:
        value = row.cpu.get(side)
        cells.append("—" if not value else f"{value[0]:,.0f} + {value[1]:,.0f}")
    return " / ".join(cells)


def table(rows: list[Row]) -> str:
    lines = [
        f"| scenario | tickler | {PEER} | baseline | ratio | {PEER} ratio | target | met? "
        f"| CPU µs/event (app + db): tickler / {PEER} / baseline |",
        "|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for row in rows:
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else "-"
        peer_ratio = f"{row.peer / row.baseline:.2f}" if row.peer is not None and row.baseline else "—"
        met = {True: "yes", False: "**no**", None: "-"}[row.met]
        scenario = row.scenario + (f" — {row.note}" if row.note else "")
        peer = _fmt(row.peer, row.unit) if row.peer is not None else "—"
        lines.append(
            f"| {scenario} | {_fmt(row.tickler, row.unit)} | {peer} | {_fmt(row.baseline, row.unit)} | {ratio} "
            f"| {peer_ratio} | {row.target} | {met} | {_cpu(row)} |"
        )
    return "\n".join(lines)


SETTINGS = [
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "wal_level",
    "max_connections",
    "work_mem",
    "full_page_writes",
    "commit_delay",
    "autovacuum",
]
# The settings that move results and that a run may have had differently from the report's time.
RUN_SETTINGS = ["autovacuum", "synchronous_commit", "fsync", "max_wal_size", "checkpoint_timeout", "shared_buffers"]


def server_settings(admin_url: str, names: list[str]) -> dict[str, str]:
    with psycopg.connect(admin_url) as conn:
        return dict(
            conn.execute(
                "SELECT name, setting || coalesce(' ' || unit, '') FROM pg_settings WHERE name = ANY(%s)", (names,)
            ).fetchall()
        )


def run_settings(admin_url: str) -> str:
    return ", ".join(f"{k} = {v}" for k, v in sorted(server_settings(admin_url, RUN_SETTINGS).items()))


def git_head() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=False
        ).stdout.strip()
    except OSError:
        return ""


def machine(admin_url: str) -> list[str]:
    mem_kib = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with psycopg.connect(admin_url) as conn:
        pg = conn.execute("SELECT version()").fetchone()
    settings = server_settings(admin_url, SETTINGS)
    return [
        f"- CPU: {os.cpu_count()} cores ({cpu}); memory {mem_kib / 1024 / 1024:.1f} GiB; {platform.platform()} "
        "(the machine that wrote this file; scenarios of other days, see Runs, may have run on another "
        "machine of the same size)",
        f"- PostgreSQL: {pg[0] if pg else '?'} — on the same machine, over TCP 127.0.0.1",
        "- PostgreSQL settings: " + ", ".join(f"{k} = {v}" for k, v in sorted(settings.items())),
    ]


def versions() -> str:
    parts = [f"Python {platform.python_version()}"]
    commit = git_head()
    for package in ("tickler", "psycopg", "SQLAlchemy", "Flask", "gunicorn", "granian", "orjson", "pgqueuer"):
        try:
            parts.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            parts.append(f"{package} ?")
    note = f" (git HEAD {commit} when this file was written; later commits may have landed during the run)"
    return ", ".join(parts) + (note if commit else "")


def _pipeline_section(path: Path) -> str:
    text = path.read_text() if path.exists() else ""
    blocks = []
    for begin, end in PIPELINE_BLOCKS:
        if begin in text and end in text:
            blocks.append(text[text.index(begin) : text.index(end) + len(end)])
        else:
            blocks.append(f"{begin}\n{end}")
    return "\n\n".join(blocks)


def _load(result: dict[str, Any]) -> str:
    """The load average a run saw (recorded since 2026-11-24; older runs have none)."""
    if not result.get("load"):
        return ""
    low, high = result["load"]
    return f" \N{EM DASH} load average {low:.1f}\N{EN DASH}{high:.1f} during the run"


def write(path: Path, results: dict[str, Any], ctx: Context) -> None:
    from bench.__main__ import SCENARIOS

    rows = [Row(**r) for name in SCENARIOS if name in results for r in results[name]["rows"]]
    runs = [
        f"- `{name}`: {results[name]['at']}, {results[name]['seconds']:.0f} s"
        + (f", soak of {results[name]['soak_minutes']:g} min" if results[name].get("soak_minutes") else "")
        + (f", at {results[name]['commit']}" if results[name].get("commit") else "")
        + (f", {results[name]['cluster']} server" if results[name].get("cluster") else "")
        + (f" ({results[name]['server']})" if results[name].get("server") else "")
        + _load(results[name])
        + (f"; {results[name]['note']}" if results[name].get("note") else "")
        for name in SCENARIOS
        if name in results
    ]
    findings = [
        f"### {key}\n\n{text}\n"
        for name in SCENARIOS
        if name in results
        for key, text in results[name].get("findings", {}).items()
    ]
    analysis = ANALYSIS.read_text() if ANALYSIS.exists() else ""
    parts = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench` (see bench/); everything outside the pipeline section is rewritten "
        "by each run. Medians of "
        f"{ctx.repeats} repeats; each scenario runs against a fresh database, in the same run as a plain-psycopg "
        "baseline doing the same work with the best SQL (bench/baseline.py). ratio = tickler / baseline: "
        "for events/s higher is better, for ms lower is better. The `peers` rows add pgqueuer (from PyPI, "
        'its public API, a fresh database of its own; bench/pgq.py) in the same run: "—" where it has no '
        "equivalent or was not installed. CPU µs/event (app + db): user + system CPU of the side's own "
        "processes (workers, API servers, in-process clients; not load generators) and of the PostgreSQL "
        "backends serving its database, from /proc, divided by the events (bench/cpu.py).",
        "",
        "Run it: `make bench` (installs the `bench` extra: pgqueuer, granian, orjson; then "
        "`.venv/bin/python -m bench`: everything, ~70 min with `--soak-minutes 10`; the full soak is "
        "30 min more). A full run starts a private PostgreSQL cluster (initdb into a temporary directory, the "
        "settings of bench/cluster.py: autovacuum, fsync and synchronous_commit on, shared_buffers 128MB) "
        "so that no earlier ALTER SYSTEM of the machine's server counts; `--server local` or "
        "`--database-url URL` measure a given server instead, its settings recorded below. "
        "`.venv/bin/python -m bench --only claim lateness` (rerun some scenarios; the others' rows "
        "are kept from bench/results.json), `.venv/bin/python -m bench --quick` (tiny sizes, the local "
        "server, proves the harness works, writes nothing; CI), `.venv/bin/python -m bench --report-only` "
        "(rewrite this file from bench/results.json). Options: `--repeats N`, `--soak-minutes M`. "
        "`.venv/bin/python -m bench.walprofile` breaks the WAL of a delivered event down by record type, "
        "beside the baseline's (pg_waldump; needs a PostgreSQL on this machine).",
        "",
        "## Results",
        "",
        table(rows),
        "",
        "## Machine",
        "",
        *machine(ctx.admin_url),
        f"- Versions: {versions()}",
        "",
        "## Runs",
        "",
        *runs,
        "",
        analysis,
        "## Measured details",
        "",
        *findings,
        "## Pipeline",
        "",
        _pipeline_section(path),
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts))
    if "scaling" in results:
        scaling_doc.write(path.with_name("scaling.md"), results)
