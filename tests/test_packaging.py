"""The distribution installs one import package, `tickler`, so that a program embedding the worker
(SPEC §5) keeps its own `config`, `api` or `cli`. The code lives under tickler/ (tickler/scheduler/,
tickler/api/, ...), and each of those folders is also reached from the top of the repository by a
relative link (scheduler -> tickler/scheduler): each file has one module name,
`tickler.scheduler.rules`, for Python and for the static tools alike."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tickler.pipeline import ship

ROOT = Path(__file__).resolve().parent.parent
# tickler's subpackages, each linked from the top of the repository.
FOLDERS = ("scheduler", "api", "commands", "config", "migrations", "pipeline")
# The names a module of the repository was once imported by (`scheduler.rules`, `cli`).
BARE_NAMES = {*FOLDERS, "cli", "wsgi"}
# What the wheel is built from: the project's metadata and tickler/.
SOURCES = ("pyproject.toml", "README.md", "tickler")
# What the Makefile installs with (`$(PIP)`): its environment, such as the warning it silences.
MAKE_PIP = re.search(r"^PIP\s*:=\s*(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)


def package_files() -> dict[str, Path]:
    """Every file of the package, by its path in a wheel: {"tickler/scheduler/rules.py": ..., ...}."""
    found = {}
    for folder, dirs, names in os.walk(ROOT / "tickler"):
        dirs[:] = [name for name in dirs if name != "__pycache__"]
        for name in names:
            path = Path(folder, name)
            found[path.relative_to(ROOT).as_posix()] = path
    return found


def copy_sources(destination: Path) -> None:
    """The sources of a build."""
    destination.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / name, destination / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, destination / name)


# A program with packages of its own named as tickler's folders are, which runs a worker.
EMBEDDER = """
import json, sys, threading

import api, config  # the program's own, found first (the script's folder)

import tickler
from tickler.config import Settings
from tickler.scheduler.db import create_engine
from tickler.scheduler.models import NewEvent
from tickler.scheduler.store import QueueSettings, Store
from tickler.scheduler.worker import Worker

settings = Settings(database_url=sys.argv[1], migrate_on_start=False, pool_size=2)
engine = create_engine(settings.database_url, pool_size=2)
store = Store(engine)
queue = store.queues.put("embedded", QueueSettings(), settings).queue
store.events.schedule_batch(queue, [NewEvent("hello", {})], actor="embedder")

worker = Worker(settings=settings, name="embedded", poll_interval=0.2)
delivered = []
done = threading.Event()

@worker.handler("embedded")
def deliver(event):
    delivered.append(event.item_key)
    done.set()

worker.start()
try:
    done.wait(60)
finally:
    worker.stop()
    engine.dispose()
print(json.dumps({
    "delivered": delivered,
    "own": [config.OWN, api.OWN],
    "tickler": tickler.__file__,
    "old_names": sorted(m for m in sys.modules if m.split(".")[0] in {"scheduler", "pipeline", "commands", "cli"}),
}))
"""


def test_no_module_of_the_package_imports_a_folder_by_its_bare_name() -> None:
    """`from tickler.scheduler.rules import x`, never `from scheduler.rules import x`: a bare name
    works only from the repository's root, and would load the file a second time under it."""
    bare = []
    for name, path in package_files().items():
        if not name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), name)):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported = [node.module or ""]
            else:
                continue
            bare += [f"{name}:{node.lineno} {module}" for module in imported if module.split(".")[0] in BARE_NAMES]
    assert bare == []


def test_the_spark_code_zip_holds_the_tickler_package(tmp_path: Path) -> None:
    code = ship.build_code(tmp_path)
    names = zipfile.ZipFile(code).namelist()
    assert {name.split("/")[0] for name in names} == {"tickler"}
    assert {"tickler/__init__.py", "tickler/pipeline/importer.py", "tickler/scheduler/queries.sql"} <= set(names)
    probe = "import tickler, tickler.scheduler.rules; print(tickler.__file__)"
    env = {**os.environ, "PYTHONPATH": str(code)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(code / "tickler" / "__init__.py")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources (a build writes build/ and *.egg-info beside them)."""
    source = tmp_path_factory.mktemp("source")
    copy_sources(source)
    out = tmp_path_factory.mktemp("wheel")
    # No build environment to download: the dev extra installs setuptools beside pip.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    [built] = out.glob("tickler-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_installs_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"tickler", "tickler-0.1.0.dist-info"}
    # Every file under tickler/: a new subpackage, SQL file or template ships too.
    sources = set(package_files())
    assert {
        "tickler/api/ui/templates/ui/base.html",
        "tickler/scheduler/rules.py",
        "tickler/scheduler/database/__init__.py",
        "tickler/scheduler/database/schema.sql",
    } <= sources
    assert sources - set(names) == set()
    assert not any(zipfile.ZipFile(wheel).getinfo(name).external_attr >> 28 == 0o12 for name in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "tickler = tickler.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow
def test_a_program_with_its_own_config_and_api_embeds_the_installed_worker(
    wheel: Path, database_url: str, tmp_path: Path
) -> None:
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index"]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True)
    # The dependencies are this environment's (offline); a path line, so its .pth files (the
    # editable install of the repository) are not read.
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())  # fmt: skip
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    program = tmp_path / "program"
    for own in ("config", "api"):
        (program / own).mkdir(parents=True)
        (program / own / "__init__.py").write_text(f"OWN = {own!r}\n")
    (program / "main.py").write_text(EMBEDDER)
    clean = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    run = subprocess.run([str(python), "main.py", database_url], cwd=program, env=clean,
                         capture_output=True, text=True, timeout=90, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["delivered"] == ["hello"]
    assert result["own"] == ["config", "api"]
    assert result["tickler"].startswith(str(site))
    assert result["old_names"] == []

    command = subprocess.run([str(env_dir / "bin" / "tickler"), "--help"], cwd=program, env=clean,
                             capture_output=True, text=True, check=False)  # fmt: skip
    assert command.returncode == 0 and "worker" in command.stdout, command.stderr


def test_each_folder_of_tickler_is_reached_from_the_top_by_one_relative_link() -> None:
    """The code is under tickler/; the repository's top keeps one link per folder (scheduler ->
    tickler/scheduler), so `scheduler/queries.sql` is a path that works. git keeps the links as
    links: on Windows, `git clone -c core.symlinks=true` (with Developer Mode)."""
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True)
    links = sorted(line.split("\t")[-1] for line in listed.stdout.splitlines() if line.startswith("120000 "))
    assert links == sorted(FOLDERS)
    for folder in FOLDERS:
        link = ROOT / folder
        assert link.is_symlink(), f"{link} is not a link: check out with symbolic links"
        assert os.readlink(link) == f"tickler/{folder}"
        assert (ROOT / "tickler" / folder).is_dir() and not (ROOT / "tickler" / folder).is_symlink()


@pytest.mark.slow
def test_the_layer_contracts_hold_and_an_import_against_them_breaks_them(tmp_path: Path) -> None:
    """Bare `lint-imports` (as `make lint` runs it) holds the layers, and fails an arrow against them."""
    lint_imports = [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"]
    kept = subprocess.run(lint_imports, cwd=ROOT, capture_output=True, text=True, check=False)
    assert kept.returncode == 0, kept.stdout[-3000:] + kept.stderr[-3000:]
    assert "Contracts: 3 kept, 0 broken." in kept.stdout

    copy_sources(tmp_path)
    with (tmp_path / "tickler" / "scheduler" / "__init__.py").open("a") as engine:
        engine.write("\nimport tickler.api.problems  # noqa: E402\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # this copy's tickler, not the installed one
    broken = subprocess.run(lint_imports, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert broken.returncode == 1, broken.stdout[-3000:] + broken.stderr[-3000:]
    assert "The engine knows nothing of HTTP, the pipeline or validation libraries BROKEN" in broken.stdout
    assert "tickler.scheduler -> tickler.api.problems" in broken.stdout


# Imports every module of the package (but the WSGI entry, which builds the app and so needs a
# database), from the repository's root as pytest and `python -m` do (the folders scheduler/,
# api/, ... are importable by their bare names there), then lists each file loaded under two names.
IMPORT_ALL = """
import importlib, json, os, sys
package = sys.argv[1]  # tickler/
modules = []
for folder, dirs, files in os.walk(package):
    dirs[:] = [name for name in dirs if name != "__pycache__"]
    parts = os.path.relpath(folder, os.path.dirname(package)).split(os.sep)
    for file in files:
        if file.endswith(".py"):
            stem = file[:-3]
            modules.append((".".join(parts if stem == "__init__" else [*parts, stem]), os.path.join(folder, file)))
ours = {os.path.realpath(path) for _, path in modules}
names = [name for name, _ in modules if name != "tickler.wsgi"]
for name in names:
    importlib.import_module(name)
by_file = {}
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if path:
        by_file.setdefault(os.path.realpath(path), []).append(name)
print(json.dumps({
    "imported": len(names),
    "twice": {path: sorted(n) for path, n in by_file.items() if len(n) > 1 and path in ours},
    "bare": sorted(n for n in sys.modules if n.split(".")[0] in {"scheduler", "api", "commands", "pipeline",
                                                                  "config", "migrations", "cli", "wsgi"}),
    "files": {name: os.path.realpath(sys.modules[name].__file__) for name in names},
}))
"""


@pytest.mark.slow
def test_importing_every_module_loads_each_file_under_one_name() -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, str(ROOT / "tickler")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["imported"] > 100
    assert result["twice"] == {}
    assert result["bare"] == []
    # One file, one module: tickler.scheduler.rules is tickler/scheduler/rules.py.
    assert result["files"]["tickler.scheduler.rules"] == str(ROOT / "tickler" / "scheduler" / "rules.py")
    assert result["files"]["tickler.cli"] == str(ROOT / "tickler" / "cli.py")


@pytest.mark.slow
def test_an_editable_install_maps_the_folders_and_warns_of_nothing(tmp_path: Path) -> None:
    """`pip install -e .` as the Makefile runs it (make install, make serve): no "folders with the
    same name" notice, and the installed `tickler.scheduler` is the checkout's scheduler/ folder,
    reached through tickler/scheduler."""
    source = tmp_path / "source"
    copy_sources(source)
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    # setuptools (the build backend, no build environment to download) is this environment's: a
    # path line, so this environment's .pth files (its own editable install) are not read.
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())  # fmt: skip
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    assert MAKE_PIP is not None
    pip_env = dict(re.findall(r'(\w+)="([^"]*)"', MAKE_PIP[1]))
    assert "PYTHONWARNINGS" in pip_env
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
         "--no-build-isolation", "-e", str(source)],
        env={**os.environ, **pip_env}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "same name" not in done.stderr and "Editable installation" not in done.stderr, done.stderr[-3000:]
    probe = "import tickler.scheduler.rules as r, tickler.api.ui as u; print(r.__file__); print(u.__file__)"
    found = subprocess.run([str(python), "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    rules, ui = found.stdout.split()
    assert (rules, ui) == (
        str(source / "tickler" / "scheduler" / "rules.py"),
        str(source / "tickler" / "api" / "ui" / "__init__.py"),
    )
    assert Path(rules).resolve() == (source / "tickler" / "scheduler" / "rules.py").resolve()
