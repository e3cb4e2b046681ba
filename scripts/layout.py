"""Where each of tickler's modules lives: `[tool.setuptools] package-dir` of pyproject.toml.

The repository keeps its top-level folders (scheduler/, api/, ...) and installs them as `tickler.*`
through that map, with no links on disk. Python follows the map through the editable install's
finder; static tools that look for `tickler/scheduler/` on disk (mypy, import-linter's grimp) do
not, so scripts/typecheck.py and scripts/lint_imports.py hand them these (module, file) pairs.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """{"tickler": root/"tickler", "tickler.scheduler": root/"scheduler", ...}."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: root / folder for name, folder in setuptools["package-dir"].items()}


def modules(root: Path = ROOT) -> Iterator[tuple[str, Path]]:
    """Every Python module of the package under its one import name, with its file."""
    # The mapped folders are disjoint (tickler/ holds only __init__.py, cli.py and wsgi.py).
    for package, folder in sorted(package_dirs(root).items()):
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(folder).with_suffix("")
            if "__pycache__" not in relative.parts:
                parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
                yield ".".join((package, *parts)), path
