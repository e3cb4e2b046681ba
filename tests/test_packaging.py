"""The distribution installs one import package, `tickler`, so that a program embedding the worker
(SPEC §5) keeps its own `config`, `api` or `cli`; the repository keeps its top-level folders."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from tickler.pipeline import ship

ROOT = Path(__file__).resolve().parent.parent
# What the wheel is built from: the project's metadata, the package and the folders it links to.
SOURCES = ("pyproject.toml", "README.md", "tickler", "scheduler", "api", "config", "migrations", "pipeline", "commands")
SOURCES += ("cli.py", "wsgi.py", "scripts")  # scripts/: the build backend (tickler_build.py)

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
    # Every file of the package, through the links: a new subpackage or SQL file ships too.
    sources = {
        Path(folder, name).relative_to(ROOT).as_posix()
        for folder, _, files in os.walk(ROOT / "tickler", followlinks=True)
        if "__pycache__" not in folder
        for name in files
    }
    assert "tickler/api/ui/templates/ui/base.html" in sources
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


@pytest.mark.slow
def test_an_editable_install_warns_of_nothing(tmp_path: Path) -> None:
    """`pip install -e .` (make install, make serve) builds through scripts/tickler_build.py: no
    "folders with the same name" warning about the tickler/ folder, which is the package itself."""
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    (tmp_path / "out").mkdir()
    build = "import sys, tickler_build; print(tickler_build.build_editable(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(source / "scripts"), "PYTHONWARNINGS": "default"}
    done = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path / "out")], cwd=source, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith(".whl")
    assert "same name" not in done.stderr and "Editable installation" not in done.stderr, done.stderr[-3000:]
