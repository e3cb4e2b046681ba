"""mypy over tickler's modules under their one import name, and over the Python client.

`make typecheck` runs this, not bare `mypy`: mypy finds a module by looking for its path on disk
(`tickler/scheduler/rules.py`) and does not run the editable install's import finder, which is how
`tickler.scheduler` reaches scheduler/ (setuptools' package-dir map; mypy#13392,
setuptools#3518). So the sources are handed to mypy as (file, module name) pairs from that map:
mypy checks the real files, once each, under the names the code imports them by. The options are
pyproject.toml's [tool.mypy]; arguments are passed on to mypy (e.g. a file of the client).
"""

from __future__ import annotations

import sys
import time

from layout import ROOT, modules  # scripts/ is this script's folder, first on sys.path
from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

CLIENT = "clients/python/tickler_client"


def main(argv: list[str]) -> int:
    started = time.time()
    fscache = FileSystemCache()
    sources, options = process_options([*argv] or [str(ROOT / CLIENT)], fscache=fscache)
    if not argv:
        sources += [BuildSource(str(path), name, base_dir=None) for name, path in modules()]
    _, messages, blockers = run_build(sources, options, fscache, started, sys.stdout, sys.stderr)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    errors, _notes, files = util.count_stats(messages)
    if errors:
        print(formatter.format_error(errors, files, len(sources), blockers=blockers, use_color=options.color_output))
        return 2 if blockers else 1
    print(formatter.format_success(len(sources), options.color_output))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
