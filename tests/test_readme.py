"""The README runs verbatim, twice in a row: its `sh` and `python` blocks, in order, in one shell,
against a live `tickler serve` on a fresh data directory. A block marked `sh not-run` is left out
(it starts the server or the Spark jobs). Any non-zero exit fails the test, and so does any HTTP
answer of 400 or more (curl is told --fail-with-body). Real processes, real HTTP."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_cli_embedded import ROOT, Serve, _free_port, _stop_leftover_postgres

BLOCK = re.compile(r"^```(sh|python)([^\n]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def readme_blocks() -> list[tuple[str, str]]:
    """(language, code) of each block the test runs, in the README's order."""
    text = (ROOT / "README.md").read_text()
    return [(language, code) for language, info, code in BLOCK.findall(text) if "not-run" not in info.split()]


def readme_script(api_port: int, receiver_port: int) -> str:
    """The blocks as one bash script; only the ports and the virtualenv's path are changed."""
    bin_dir = Path(sys.executable).parent
    parts = ["set -euo pipefail"]
    for language, code in readme_blocks():
        code = code.replace(":8080", f":{api_port}").replace("9000", str(receiver_port))
        code = code.replace(".venv/bin/", f"{bin_dir}/")
        parts.append(code if language == "sh" else f"{bin_dir}/python - <<'README_PYTHON'\n{code}README_PYTHON")
    return "\n".join(parts)


@pytest.fixture
def served() -> Iterator[tuple[Serve, Path]]:
    data_dir = Path(tempfile.mkdtemp(prefix="tkl-readme-"))
    serve = Serve(data_dir, _free_port())
    try:
        serve.wait_ready()
        yield serve, data_dir
    finally:
        serve.stop()
        _stop_leftover_postgres(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def test_the_readme_has_walk_throughs_to_run() -> None:
    languages = [language for language, _ in readme_blocks()]
    assert languages.count("sh") >= 8 and languages.count("python") >= 2, languages


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_readme_runs_verbatim_twice(served: tuple[Serve, Path], tmp_path: Path) -> None:
    serve, data_dir = served
    (tmp_path / ".curlrc").write_text("fail-with-body\n")  # an HTTP error is a failed command
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TICKLER_", "CURL_"))}
    env |= {"TICKLER_DATA_DIR": str(data_dir), "CURL_HOME": str(tmp_path), "TICKLER_LOG_LEVEL": "WARNING"}
    script = readme_script(int(serve.url.rsplit(":", 1)[1]), _free_port())
    for attempt in ("first", "second"):
        done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
        assert done.returncode == 0, (
            f"the README's {attempt} run stopped ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        assert "signature ok: trial-ends:ana@example.com" in done.stdout
        assert '"outcome":"debounced"' in done.stdout.replace(" ", "")
