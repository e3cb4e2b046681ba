"""The archive's manifest: which files hold committed data, so that any reader sees whole runs only.

A run's files are placed in the queue=/date= partitions before its rows leave PostgreSQL, and a
compaction places its merged file before the files it replaces go: a reader listing the
directories would see a run half-moved, rows still live in PostgreSQL, or a compacted partition
twice. The manifest says what is committed. Each change writes a new version
`<location>/_manifest/v-<version>.json` whole under a temporary name and renames it into place
(one atomic step): readers take the highest version and read exactly the files it lists.

A version lists the committed runs (with the counts their ledger rows hold), the files of each
table (relative to `<location>/<table>/`), and the files a compaction replaced (`retired`): those
stay on disk for RETIRED_GRACE, so that a reader that took the previous version can finish, and
are deleted by a later archive or compaction job. The format is documented for other readers in
docs/pipeline.md ("Reading the archive").

Only an archive job holding the archive lock writes it. A run is committed after its rows were
deleted from PostgreSQL; a crash between the two is repaired by the next job (`reconcile`), and
until then readers see the archive as it was before the run.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tickler.pipeline import layout

FORMAT = "tickler-archive-manifest/1"
DIRECTORY = "_manifest"
KEEP_VERSIONS = 20  # older versions are removed (a reader needs only the newest)
RETIRED_GRACE = timedelta(hours=1)
# Files an erasure replaced hold what must go: kept only long enough for a reader that took the
# previous version to read them (deleted by the next erase or compaction job after that).
ERASED_GRACE = timedelta(minutes=10)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Manifest:
    version: int = 0
    runs: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, list[str]] = field(default_factory=lambda: {table: [] for table in layout.TABLES})
    retired: list[dict[str, str]] = field(default_factory=list)

    @property
    def run_ids(self) -> set[int]:
        return {int(run["run"]) for run in self.runs}

    def paths(self, location: str, table: str) -> list[str]:
        """The committed files of `table`, in full."""
        root = layout.table_root(location, table)
        return [f"{root}/{name}" for name in self.files.get(table, [])]

    def to_json(self) -> str:
        return json.dumps(
            {"format": FORMAT, "version": self.version, "written_on": _now(), "runs": self.runs,
             "files": self.files, "retired": self.retired},
            indent=1,
        )  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} manifest: {data.get('format')!r}")
        files = {table: list(data["files"].get(table, [])) for table in layout.TABLES}
        return cls(int(data["version"]), list(data["runs"]), files, list(data.get("retired", [])))


def _version_name(version: int) -> str:
    return f"v-{version:09d}.json"


def _versions(files: layout.Files, location: str) -> list[int]:
    names = [name for name, is_dir in files.listing(f"{location}/{DIRECTORY}") if not is_dir]
    return sorted(int(n[2:-5]) for n in names if n.startswith("v-") and n.endswith(".json") and n[2:-5].isdigit())


def read(files: layout.Files, location: str) -> Manifest | None:
    """The newest version; None when the location has none yet."""
    versions = _versions(files, location)
    if not versions:
        return None
    return Manifest.from_json(files.read_text(f"{location}/{DIRECTORY}/{_version_name(versions[-1])}"))


def write(files: layout.Files, location: str, manifest: Manifest) -> Manifest:
    """Publish `manifest` as the next version (written whole, then renamed into place)."""
    directory = f"{location}/{DIRECTORY}"
    manifest.version = max([manifest.version, *_versions(files, location)]) + 1
    temporary = f"{directory}/.v-{uuid.uuid4().hex}.json.tmp"
    files.write_text(temporary, manifest.to_json())
    files.rename(temporary, f"{directory}/{_version_name(manifest.version)}")
    for old in _versions(files, location)[:-KEEP_VERSIONS]:
        files.delete(f"{directory}/{_version_name(old)}")
    return manifest


def run_files(files: layout.Files, location: str, run_id: int) -> dict[str, list[str]]:
    """The files run `run_id` placed, per table (relative to the table's root)."""
    prefix = layout.run_prefix(run_id)
    found: dict[str, list[str]] = {}
    for table in layout.TABLES:
        partitions = files.partition_files(layout.table_root(location, table))
        found[table] = [f"{p}/{name}" for p, names in partitions.items() for name in names if name.startswith(prefix)]
    return found


def _entry(run: dict[str, Any]) -> dict[str, Any]:
    """What the manifest says of a run: its ledger's figures."""
    cutoff = run["cutoff"]
    return {
        "run": int(run["id"]),
        "cutoff": cutoff.isoformat().replace("+00:00", "Z") if isinstance(cutoff, datetime) else str(cutoff),
        "events": int(run["event_count"]),
        "timeline": int(run["timeline_count"]),
    }


def commit_runs(files: layout.Files, location: str, runs: list[dict[str, Any]]) -> Manifest:
    """Make these runs (ledger rows whose rows left PostgreSQL) visible, with their files, at once."""
    manifest = read(files, location) or Manifest()
    new = [run for run in runs if int(run["id"]) not in manifest.run_ids]
    if not new and manifest.version:
        return manifest
    for run in new:
        for table, names in run_files(files, location, int(run["id"])).items():
            manifest.files[table] = sorted({*manifest.files[table], *names})
        manifest.runs.append(_entry(run))
    manifest.runs.sort(key=lambda r: int(r["run"]))
    return write(files, location, manifest)


def reconcile(files: layout.Files, location: str, runs: list[dict[str, Any]], unfinished: int | None) -> Manifest:
    """The manifest holding every run of the ledger whose rows left PostgreSQL (`runs`): repairs a
    crash between a run's delete and its commit, and starts the manifest of an archive written
    before manifests had one (every visible file but those of the `unfinished` run)."""
    if read(files, location) is None:
        _finish_legacy_compactions(files, location)
        _bootstrap(files, location, runs, unfinished)
    return commit_runs(files, location, runs)


def _finish_legacy_compactions(files: layout.Files, location: str) -> None:
    """A compaction of the release before manifests that died after its `ready` marker, with some
    of the files it replaces deleted: finish its swap (as that release's next compaction would)."""
    for table in layout.TABLES:
        root = layout.table_root(location, table)
        for queue, _ in files.listing(root):
            for day, _ in files.listing(f"{root}/{queue}"):
                partition = f"{root}/{queue}/{day}"
                for name, is_dir in files.listing(partition):
                    work = f"{partition}/{name}"
                    if not (is_dir and name.startswith("_compact-") and files.exists(f"{work}/ready")):
                        continue
                    for replaced, _ in files.listing(f"{work}/replaces"):
                        files.delete(f"{partition}/{replaced}")
                    for data, data_is_dir in files.listing(f"{work}/data"):
                        if not data_is_dir and data.endswith(".parquet"):
                            files.rename(
                                f"{work}/data/{data}", f"{partition}/compact-{name[len('_compact-') :]}.parquet"
                            )
                    files.delete(work)


def _bootstrap(files: layout.Files, location: str, runs: list[dict[str, Any]], unfinished: int | None) -> Manifest:
    manifest = Manifest()
    skip = layout.run_prefix(unfinished) if unfinished is not None else None
    for table in layout.TABLES:
        partitions = files.partition_files(layout.table_root(location, table))
        manifest.files[table] = sorted(f"{p}/{name}" for p, names in partitions.items() for name in names
                                       if skip is None or not name.startswith(skip))  # fmt: skip
    manifest.runs = sorted((_entry(run) for run in runs), key=lambda r: int(r["run"]))
    return write(files, location, manifest)


def replace(
    files: layout.Files, location: str, table: str, swaps: dict[str, list[str]], *, erased: bool = False
) -> Manifest:
    """Publish merged files in place of those they replace ({merged: [replaced]}), in one version;
    the replaced ones are retired, not deleted: a reader of the previous version may be reading them.
    `erased` (an erasure: the replaced files hold what must go): retired for ERASED_GRACE only."""
    manifest = read(files, location) or Manifest()
    replaced = {name for names in swaps.values() for name in names}
    manifest.files[table] = sorted({*(n for n in manifest.files[table] if n not in replaced), *swaps})
    now = _now()
    mark: dict[str, Any] = {"erased": True} if erased else {}
    manifest.retired += [{"path": f"{table}/{name}", "retired_on": now, **mark} for name in sorted(replaced)]
    return write(files, location, manifest)


def remove_retired(
    files: layout.Files,
    location: str,
    grace: timedelta = RETIRED_GRACE,
    *,
    erased_grace: timedelta = ERASED_GRACE,
    now: datetime | None = None,
) -> int:
    """Delete the replaced files retired longer ago than `grace` (`erased_grace` for those an
    erasure replaced); how many went."""
    manifest = read(files, location)
    if manifest is None:
        return 0
    now = now or datetime.now(UTC)

    def expired_entry(entry: dict[str, Any]) -> bool:
        retired_on = datetime.fromisoformat(entry["retired_on"].replace("Z", "+00:00"))
        return retired_on <= now - (erased_grace if entry.get("erased") else grace)

    expired = [r for r in manifest.retired if expired_entry(r)]
    if not expired:
        return 0
    manifest.retired = [r for r in manifest.retired if r not in expired]
    write(files, location, manifest)  # first unlisted, then deleted: a listed file always exists
    for entry in expired:
        files.delete(f"{location}/{entry['path']}")
    return len(expired)


# -- reading -------------------------------------------------------------------------------------


def read_files(spark: SparkSession, location: str, table: str, names: list[str]) -> DataFrame | None:
    """These files of `table` (relative to its root), with the partition columns queue and date."""
    if not names:
        return None
    root = layout.table_root(location, table)
    return spark.read.option("basePath", root).parquet(*[f"{root}/{name}" for name in names])


def read_committed(spark: SparkSession, location: str, table: str) -> DataFrame | None:
    """The committed rows of `table` at `location` (columns run, queue, date among them); None if none."""
    manifest = read(layout.Files(spark), location)
    return read_files(spark, location, table, manifest.files[table]) if manifest else None


def read_runs(
    spark: SparkSession, runs: list[tuple[int, str]], table: str, *, since: date | None = None
) -> DataFrame | None:
    """The rows of `table` of these (run id, location) pairs, runs whose rows left PostgreSQL as of
    the reader's snapshot: the committed files, and for a run deleted but not yet in the manifest
    (a crash between the two steps), the files it placed. With `since`, only the directories of
    events that finished on that day or later (`date=`)."""
    files = layout.Files(spark)
    by_location: dict[str, list[int]] = {}
    for run_id, location in runs:
        by_location.setdefault(location, []).append(run_id)
    frames = []
    for location, ids in by_location.items():
        manifest = read(files, location)
        if manifest is None:  # an archive written before manifests: its visible files are its runs'
            partitions = files.partition_files(layout.table_root(location, table))
            names = {f"{p}/{name}" for p, found in partitions.items() for name in found}
        else:
            names = set(manifest.files[table])
            for run_id in set(ids) - manifest.run_ids:
                names.update(run_files(files, location, run_id)[table])
        if since is not None:
            names = {name for name in names if _day(name) >= since.isoformat()}
        frame = read_files(spark, location, table, sorted(names))
        if frame is not None:
            frames.append(frame.where(F.col("run").isin(ids)))
    if not frames:
        return None
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def _day(name: str) -> str:
    """The `date=` of a file's partition ("queue=q/date=2026-11-02/x.parquet": "2026-11-02")."""
    return next((part[len("date=") :] for part in name.split("/") if part.startswith("date=")), "")
