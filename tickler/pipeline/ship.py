"""What a cluster's executors need to run the jobs' Python code, shipped with the job.

An executor of `--master spark://...` (or yarn, k8s) has Python and pyspark and nothing else: the
job sends tickler's own packages as a zip (`addPyFile`, on the workers' `sys.path` before a task's
function is unpickled) and the third-party modules the tasks import (psycopg with its compiled
libpq, SQLAlchemy, ...) as an archive that Spark unpacks in each executor's working directory,
which the Python workers find through PYTHONPATH. Compiled modules are the driver's, so the
executors' Python must be the same minor version (`spark.pyspark.python` chooses it).
"""

from __future__ import annotations

import importlib.util
import os
import tarfile
import zipfile
from pathlib import Path

# tickler's packages that task functions reach (the importer's loader, the rules, the SQL files),
# shipped inside the `tickler` package (with its `__init__.py`) as the executors import them.
OWN_PACKAGES = ("tickler.pipeline", "tickler.scheduler", "tickler.config")
# Third-party top-level modules those packages import on an executor, with the directories of
# compiled libraries that travel beside them.
DEPENDENCIES = ("psycopg", "psycopg_binary", "sqlalchemy", "typing_extensions")
DEPS_DIR = "tickler-deps"  # where the archive is unpacked, relative to an executor's working directory
CODE_ZIP = "tickler-code.zip"


def _locations(name: str) -> list[Path]:
    """The files of a top-level module or package: its directory (and `<name>.libs`), or its file."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return []
    if spec.submodule_search_locations:
        found = [Path(p) for p in spec.submodule_search_locations]
        libs = found[0].with_name(f"{found[0].name}.libs")  # auditwheel's vendored shared libraries
        return found + ([libs] if libs.is_dir() else [])
    return [Path(spec.origin)] if spec.origin else []


def _skip(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix == ".pyc"


def _files(root: Path) -> list[Path]:
    """The files under `root` (a package's folder: scheduler/ in a checkout, tickler/scheduler/ installed)."""
    found = [Path(folder, name) for folder, _, names in os.walk(root, followlinks=True) for name in names]
    return sorted(path for path in found if not _skip(path))


def build(directory: Path) -> tuple[Path, Path]:
    """Write the code zip and the dependency archive into `directory`; return their paths."""
    code = build_code(directory)
    deps = directory / f"{DEPS_DIR}.tar.gz"
    with tarfile.open(deps, "w:gz") as out:
        for name in DEPENDENCIES:
            for path in _locations(name):
                out.add(path, arcname=path.name, filter=lambda info: None if _skip(Path(info.name)) else info)
    return code, deps


def build_code(directory: Path) -> Path:
    """Write the zip of tickler's own code into `directory`: the `tickler` package the tasks import."""
    directory.mkdir(parents=True, exist_ok=True)
    code = directory / CODE_ZIP
    with zipfile.ZipFile(code, "w", zipfile.ZIP_DEFLATED) as out:
        for init in _locations("tickler")[:1]:
            out.write(init / "__init__.py", "tickler/__init__.py")
        for name in OWN_PACKAGES:
            for root in _locations(name):
                for path in _files(root):
                    out.write(path, str(Path(*name.split(".")) / path.relative_to(root)))
    return code


def executor_settings(deps: Path, conf: dict[str, str]) -> dict[str, str]:
    """Spark settings that unpack `deps` beside each executor and put it on its Python workers' path."""
    archives = ",".join(filter(None, [conf.get("spark.archives"), f"{deps}#{DEPS_DIR}"]))
    path = ":".join(filter(None, [DEPS_DIR, conf.get("spark.executorEnv.PYTHONPATH")]))
    return {"spark.archives": archives, "spark.executorEnv.PYTHONPATH": path}
