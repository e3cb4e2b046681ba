"""The README and the docs pages run verbatim, twice in a row: each page's `sh` and `python` blocks,
in order, in one shell, against a live `tickler serve` on a fresh data directory of its own. A block
marked `sh not-run` (or `python not-run`) is left out (it starts the server, needs Spark or root, or
is a fragment). Any non-zero exit fails the test, and so does any HTTP answer of 400 or more (curl
is told --fail-with-body). Real processes, real HTTP. And every relative link of those pages leads
to a file of the repository, and to a heading of it when it names one."""

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

# An embedded PostgreSQL of its own, whatever TICKLER_TEST_DATABASE_URL names.
pytestmark = pytest.mark.own_server

BLOCK = re.compile(r"^```(sh|python)([^\n]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# What a page's run prints when its blocks did what they say (compared with spaces left out).
EXPECTED = {
    "README.md": ["signature ok: trial-ends:ana@example.com", '"action": "rescheduled"'],
    "docs/api.md": ['"outcome": "debounced"', '"cancelled": 2', '"schedule_key": "daily-digest"'],
    "docs/delivery.md": ['"lease_id":', '"rate_per_second": 50.0', '"signing_secret":'],
    "docs/operations.md": ['"redeliver_count": 1', '"deleted_events": 1', "receipt:order-3"],
}


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def blocks(page: Path) -> list[tuple[str, str]]:
    """(language, code) of each block of the page the test runs, in the page's order."""
    text = page.read_text()
    return [(language, code) for language, info, code in BLOCK.findall(text) if "not-run" not in info.split()]


def walk_throughs() -> list[Path]:
    """The pages with blocks to run."""
    return [page for page in PAGES if blocks(page)]


def page_script(page: Path, api_port: int, receiver_port: int) -> str:
    """The page's blocks as one bash script; only the ports and the virtualenv's path are changed."""
    bin_dir = Path(sys.executable).parent
    parts = ["set -euo pipefail"]
    for language, code in blocks(page):
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


def test_the_readme_and_the_docs_have_walk_throughs_to_run() -> None:
    pages = [name(page) for page in walk_throughs()]
    assert set(EXPECTED) <= set(pages), pages
    languages = [language for page in walk_throughs() for language, _ in blocks(page)]
    assert languages.count("sh") >= 12 and languages.count("python") >= 2, languages
    readme = [language for language, _ in blocks(ROOT / "README.md")]
    assert readme.count("sh") >= 2 and readme.count("python") >= 1, readme  # the walk-through and a delivery


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", walk_throughs(), ids=name)
def test_the_page_runs_verbatim_twice(page: Path, served: tuple[Serve, Path], tmp_path: Path) -> None:
    serve, data_dir = served
    (tmp_path / ".curlrc").write_text("fail-with-body\n")  # an HTTP error is a failed command
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TICKLER_", "CURL_"))}
    env |= {"TICKLER_DATA_DIR": str(data_dir), "CURL_HOME": str(tmp_path), "TICKLER_LOG_LEVEL": "WARNING"}
    script = page_script(page, int(serve.url.rsplit(":", 1)[1]), _free_port())
    for attempt in ("first", "second"):
        done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
        assert done.returncode == 0, (
            f"{name(page)}'s {attempt} run stopped ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        printed = done.stdout.replace(" ", "")
        for expected in EXPECTED.get(name(page), []):
            assert expected.replace(" ", "") in printed, (name(page), attempt, expected, done.stdout[-3000:])


# Links: [text](target) and ![alt](target), outside code; a target is a path, #anchor, or both.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)


def prose(text: str) -> str:
    return CODE.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """GitHub's ids of the page's headings: lower case, punctuation dropped, spaces as hyphens, a
    repeated one numbered."""
    seen: dict[str, int] = {}
    ids = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        ids.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return ids


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.is_relative_to(ROOT):
            continue  # beside the repository (the shared SPEC.md): not this test's to check
        missing_anchor = anchor and linked.suffix == ".md" and linked.exists() and anchor not in anchors(linked)
        if not linked.exists() or missing_anchor:
            broken.append(target)
    assert broken == [], f"{name(page)}: {broken}"
