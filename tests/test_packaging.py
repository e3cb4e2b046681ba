"""The distribution installs one import package, `tickler`, so that a program embedding the worker
(SPEC §5) keeps its own `config`, `api` or `cli`; the repository keeps its top-level folders, mapped
to `tickler.*` by pyproject.toml's package-dir (no links: each file has one module name)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from tickler.pipeline import ship

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
# The package's folders: {"tickler": "tickler", "tickler.scheduler": "scheduler", ...}.
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]
# What the wheel is built from: the project's metadata and the package's folders.
SOURCES = ("pyproject.toml", "README.md", *PACKAGE_DIR.values())
# What the Makefile installs with (`$(PIP)`): its environment, such as the warning it silences.
MAKE_PIP = re.search(r"^PIP\s*:=\s*(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)

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


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tickler_imports", ROOT / "scripts" / "tickler_imports.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_module_of_the_repository_uses_the_old_names() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "tickler_imports.py"), "--check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout


def test_the_rewrite_moves_imports_and_module_strings_once_and_nothing_else() -> None:
    script = _script()
    before = (
        "import commands as ops\n"
        "import config\n"
        "from scheduler.store import Store\n"
        "    from api import create_app\n"
        'run([sys.executable, "-m", "cli", "worker"])\n'
        'gunicorn("wsgi:app")\n'
        'resources.files("scheduler.store")\n'
        'environ["wsgi.input"]\n'
        "from schedulers import x\n"
        "from tests.helpers import schedule\n"
    )
    after = script.rewrite_python(before)
    assert after == (
        "from tickler import commands as ops\n"
        "from tickler import config\n"
        "from tickler.scheduler.store import Store\n"
        "    from tickler.api import create_app\n"
        'run([sys.executable, "-m", "tickler.cli", "worker"])\n'
        'gunicorn("tickler.wsgi:app")\n'
        'resources.files("tickler.scheduler.store")\n'
        'environ["wsgi.input"]\n'
        "from schedulers import x\n"
        "from tests.helpers import schedule\n"
    )
    assert script.rewrite_python(after) == after
    doc = "Run `python -m cli serve`; `scheduler.rules` checks keys; `gunicorn wsgi:app`; see `cli.py`;"
    doc += " `from api import x`."
    assert script.rewrite_doc(doc) == (
        "Run `python -m tickler.cli serve`; `tickler.scheduler.rules` checks keys; `gunicorn tickler.wsgi:app`;"
        " see `cli.py`; `from tickler.api import x`."
    )
    assert script.rewrite_doc(script.rewrite_doc(doc)) == script.rewrite_doc(doc)


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
    for name in SOURCES:
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
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
    # Every file of the package's folders: a new SQL file or template ships too.
    sources = {
        "/".join((*package.split("."), path.relative_to(ROOT / folder).as_posix()))
        for package, folder in PACKAGE_DIR.items()
        for path in (ROOT / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert "tickler/api/ui/templates/ui/base.html" in sources and "tickler/scheduler/rules.py" in sources
    assert sources - set(names) == set()
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


def test_every_subpackage_of_the_folders_is_listed_for_setuptools() -> None:
    """`packages` in pyproject.toml names each folder holding an `__init__.py` (a subpackage left
    out would be missing from the wheel, and found only in a checkout)."""
    found = {
        ".".join((package, *init.parent.relative_to(ROOT / folder).parts))
        for package, folder in PACKAGE_DIR.items()
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert found - set(SETUPTOOLS["packages"]) == set()


def test_the_repository_holds_no_symbolic_links() -> None:
    """A checkout without symbolic links (Windows' default) is the same checkout."""
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True)
    links = [line.split("\t")[-1] for line in listed.stdout.splitlines() if line.startswith("120000 ")]
    assert links == []
    assert sorted(p.name for p in (ROOT / "tickler").iterdir() if p.name != "__pycache__") == [
        "__init__.py",
        "cli.py",
        "wsgi.py",
    ]


# Imports every module of the package (but the WSGI entry, which builds the app and so needs a
# database), from the repository's root as pytest and `python -m` do (the folders scheduler/,
# api/, ... are importable by their bare names there), then lists each file loaded under two names.
IMPORT_ALL = """
import importlib, json, os, sys
sys.path.insert(0, sys.argv[1])  # scripts/, for the (module, file) pairs
from layout import modules
ours = {os.path.realpath(path) for _, path in modules()}
names = [name for name, _ in modules() if name != "tickler.wsgi"]
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
        [sys.executable, "-c", IMPORT_ALL, str(ROOT / "scripts")],
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
    # The tree on disk is the tree imported: tickler.scheduler.rules is scheduler/rules.py itself.
    assert result["files"]["tickler.scheduler.rules"] == str(ROOT / "scheduler" / "rules.py")
    assert result["files"]["tickler.cli"] == str(ROOT / "tickler" / "cli.py")


@pytest.mark.slow
def test_an_editable_install_maps_the_folders_and_warns_of_nothing(tmp_path: Path) -> None:
    """`pip install -e .` as the Makefile runs it (make install, make serve): no "folders with the
    same name" notice, and the installed `tickler.scheduler` is the checkout's scheduler/ folder."""
    source = tmp_path / "source"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
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
    assert found.stdout.split() == [str(source / "scheduler" / "rules.py"), str(source / "api" / "ui" / "__init__.py")]
