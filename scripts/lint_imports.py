"""import-linter's contracts (pyproject.toml) over tickler's modules under their one import name.

`make lint` runs this, not bare `lint-imports`: import-linter's graph builder (grimp) finds the
modules of `tickler` by walking the folder of `tickler/__init__.py`, and the package-dir map puts
`tickler.scheduler` in scheduler/, not under tickler/ (no links on disk). So the graph is built here,
from the same (module, file) pairs as the install (scripts/layout.py), by reading each file's
imports as grimp does: absolute and relative, also inside functions and `if TYPE_CHECKING:`;
third-party packages as their top-level name. The contracts, the report and the exit status are
import-linter's own; arguments are passed on to it (e.g. --verbose, --contract).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import grimp
from importlinter import cli
from importlinter.application.app_config import settings
from layout import modules  # scripts/ is this script's folder, first on sys.path


def _resolve(name: str, internal: set[str]) -> str:
    """An internal import to the module that holds it: `tickler.x.y.Name` -> `tickler.x.y`."""
    while name not in internal and "." in name:
        name = name.rpartition(".")[0]
    return name


def _imports(name: str, path: Path, internal: set[str]) -> list[tuple[str, int, str]]:
    """(imported module, line, line's text) of each import in the file."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, list[str], int]] = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append((base, [alias.name for alias in node.names], node.lineno))
    result = []
    for module, names, line in found:
        text = lines[line - 1].strip()
        if module.split(".")[0] != "tickler":
            result.append((module.split(".")[0], line, text))
            continue
        targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in internal] or [module]
        result += [(_resolve(target, internal), line, text) for target in targets]
    return result


class Builder:
    """import-linter's GraphBuilder port, for the package-dir map."""

    def build(self, root_package_names: list[str], *args: Any, **kwargs: Any) -> grimp.ImportGraph:
        assert root_package_names == ["tickler"], f"pyproject.toml: root_packages is {root_package_names}"
        pairs = dict(modules())
        graph = grimp.ImportGraph()
        for name in pairs:
            graph.add_module(name)
        internal = set(pairs)
        for name, path in pairs.items():
            for imported, line, text in _imports(name, path, internal):
                if imported not in internal and imported not in graph.modules:
                    graph.add_module(imported, is_squashed=True)
                if imported != name:
                    graph.add_import(importer=name, imported=imported, line_number=line, line_contents=text)
        return graph


if __name__ == "__main__":
    settings.configure(GRAPH_BUILDER=Builder())
    sys.exit(cli.lint_imports_command())
