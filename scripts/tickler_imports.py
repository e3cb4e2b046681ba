"""Rewrite tickler's own imports and module strings to the `tickler.` package name.

The repository keeps its top-level folders (scheduler/, api/, ...), but the installed distribution
holds one import package, `tickler`, so that a program embedding the worker may have its own
`config` or `api`. This script moves code written against the old names to the new ones:

    python scripts/tickler_imports.py            # rewrite in place, print the files changed
    python scripts/tickler_imports.py --check    # change nothing; exit 1 and list what would change

It is idempotent (a second run changes nothing) and touches only imports and module strings:
`from scheduler.x import y`, `import commands as c`, `"-m", "cli"` and `python -m cli`,
`wsgi:app`, `resources.files("scheduler")`, and backquoted module paths in README/docs.
It skips .venv, clients/ (the client package stands alone),
CHANGELOG.md (history), itself and its test.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("scheduler", "api", "config", "migrations", "pipeline", "commands", "cli", "wsgi")
_N = "|".join(NAMES)
SKIP_DIRS = {".venv", "clients", "build", "node_modules", ".git", ".tickler", ".tickler-test"}
# The script and its test hold old names as examples.
SKIP_FILES = {"CHANGELOG.md", "scripts/tickler_imports.py", "tests/test_packaging.py"}

# Statements at the start of a line (also inside strings holding code, which run the same way).
_FROM = re.compile(rf"^(\s*from\s+)({_N})(?=[.\s])", re.MULTILINE)
_IMPORT_AS = re.compile(rf"^(\s*)import\s+({_N})(\s+as\s+\w+)?[ \t]*$", re.MULTILINE)
_IMPORT_DOTTED = re.compile(rf"^(\s*import\s+)({_N})(\.[\w.]+\s+as\s+\w+)[ \t]*$", re.MULTILINE)
# Module strings: `"-m", "cli"` (subprocess argument lists), `python -m cli` (commands in docs),
# `wsgi:app` (gunicorn's application), `resources.files("scheduler")`.
_DASH_M_LIST = re.compile(rf"""(["']-m["'],\s*["'])({_N})(?=[."'])""")
_DASH_M_COMMAND = re.compile(rf"(\bpython3?\S*\s+-m\s+)({_N})\b")
_APP = re.compile(r"(?<![\w.])wsgi:app\b")
_RESOURCES = re.compile(rf"""(resources\.files\(\s*["'])({_N})(?=[."'])""")
# Docs: a backquoted module path such as `scheduler.rules` or `scheduler.store.archive.archived_history(...)`.
# and an import in running text: `from scheduler.worker import Worker; ...`.
# (`cli.py` and `wsgi.py` name files, kept.)
_DOC_FROM = re.compile(rf"(?<=`)(from[ \t]+)({_N})(?=[.\s])")
_DOC_PATH = re.compile(rf"(?<=`)({_N})(?!\.py`)(\.[a-z_][\w.]*)(?=[`(])")


def rewrite_python(text: str) -> str:
    text = _FROM.sub(r"\1tickler.\2", text)
    text = _IMPORT_DOTTED.sub(r"\1tickler.\2\3", text)
    text = _IMPORT_AS.sub(lambda m: f"{m[1]}from tickler import {m[2]}{m[3] or ''}", text)
    return rewrite_strings(text)


def rewrite_strings(text: str) -> str:
    text = _DASH_M_LIST.sub(r"\1tickler.\2", text)
    text = _DASH_M_COMMAND.sub(r"\1tickler.\2", text)
    text = _APP.sub("tickler.wsgi:app", text)
    return _RESOURCES.sub(r"\1tickler.\2", text)


def rewrite_doc(text: str) -> str:
    text = _DOC_FROM.sub(r"\1tickler.\2", _rewrite_code_lines(text))
    return _DOC_PATH.sub(r"tickler.\1\2", rewrite_strings(text))


def _rewrite_code_lines(text: str) -> str:
    """Import lines in Markdown code blocks, as in Python files."""
    text = _FROM.sub(r"\1tickler.\2", text)
    return _IMPORT_AS.sub(lambda m: f"{m[1]}from tickler import {m[2]}{m[3] or ''}", text)


def candidates(root: Path) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part in SKIP_DIRS for part in relative.parts[:-1]) or relative.as_posix() in SKIP_FILES:
            continue
        if (path.is_file() and not path.is_symlink() and path.suffix in {".py", ".md", ".sh"}) or (
            path.is_file() and relative.parts[0] == ".ci"
        ):
            found.append(path)
    return found


def main(argv: list[str]) -> int:
    check = "--check" in argv
    changed = []
    for path in candidates(ROOT):
        before = path.read_text(encoding="utf-8")
        after = rewrite_python(before) if path.suffix == ".py" else rewrite_doc(before)
        if after != before:
            changed.append(path.relative_to(ROOT).as_posix())
            if not check:
                path.write_text(after, encoding="utf-8")
    for name in changed:
        print(("would rewrite " if check else "rewrote ") + name)
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
