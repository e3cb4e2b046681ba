"""The client is a package of its own: one declared dependency (the outbox's driver is an extra),
nothing of the server imported.
(`clients/python/check_install.py`, run by .ci/run, installs it into a fresh virtualenv.)"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import requires, version

import tickler_client
from packaging.requirements import Requirement

SERVER_MODULES = ("flask", "sqlalchemy", "psycopg", "pyspark", "marshmallow", "apscheduler", "tickler")


def test_the_only_dependency_is_httpx_and_the_outbox_is_an_extra() -> None:
    declared = [Requirement(r) for r in requires("tickler-client") or []]
    assert {r.name for r in declared if r.marker is None} == {"httpx"}
    assert {r.name for r in declared if r.marker and r.marker.evaluate({"extra": "outbox"})} == {"psycopg"}
    assert version("tickler-client") == tickler_client.__version__


def test_importing_the_client_imports_nothing_of_the_server() -> None:
    probe = (
        f"import sys, tickler_client; print(sorted(m for m in sys.modules if m.split('.')[0] in {SERVER_MODULES!r}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd="/")
    assert out.stdout.strip() == "[]"


def test_the_package_is_typed() -> None:
    from importlib.resources import files

    assert files("tickler_client").joinpath("py.typed").is_file()
