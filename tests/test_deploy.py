"""The deployment files (deploy/) follow the documented steps: the image builds the same wheel the
packaging test builds, migrations run as their own step before the API and the workers, and the
units start the same commands. No container daemon here: these check the files themselves; the
image is built by .ci/run where `docker info` answers (docs/deploy.md says what ran where)."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import yaml

from tests import pg
from tests.test_packaging import SOURCES
from tickler.api import close_app, create_app
from tickler.config import Settings
from tickler.scheduler.db import libpq_url
from tickler.scheduler.migrate import migrate

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def test_the_image_copies_everything_the_wheel_is_built_from() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    build, runtime = dockerfile.split("\nFROM ")[1:]
    copied: set[str] = set()
    for line in build.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            *sources, _ = line.split()[1:]
            copied |= {source.rstrip("/") for source in sources}
    assert copied == set(SOURCES), sorted(set(SOURCES) ^ copied)
    assert "TICKLER_MIGRATE_ON_START=false" in runtime


def test_the_image_is_pinned_runs_as_no_root_and_has_no_embedded_postgresql() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    for base in re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE):
        # an exact tag (3.11.14-..., not 3.11-slim) or a digest
        assert "@sha256:" in base or re.search(r":\d+\.\d+\.\d+", base), base
    [install] = [line for line in dockerfile.splitlines() if line.startswith("RUN pip install")]
    assert "--constraint /wheels/constraints.txt" in install and "[" not in install  # no extra: no pgserver
    assert "COPY deploy/constraints.txt /wheels/constraints.txt" in dockerfile
    [user] = re.findall(r"^USER (\S+)", dockerfile, re.MULTILINE)
    assert user.split(":")[0] not in ("root", "0"), user
    assert "HEALTHCHECK" not in dockerfile.replace("No HEALTHCHECK", "")  # each service says its own


def test_the_constraints_pin_every_production_dependency_and_not_the_embedded_database() -> None:
    pins = dict(line.split("==") for line in (DEPLOY / "constraints.txt").read_text().splitlines() if "==" in line)
    assert {"flask", "sqlalchemy", "psycopg", "psycopg-binary", "gunicorn", "structlog"} <= set(pins)
    assert "pgserver" not in pins and "psutil" not in pins
    # a plain install has it (SPEC: `tickler serve` without a URL starts it); the image removes it
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "pip uninstall --yes pgserver" in dockerfile


def test_compose_migrates_before_the_api_and_the_workers_start() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"db", "migrate", "api", "worker"}
    assert services["migrate"]["command"] == ["tickler", "migrate"]
    assert services["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    for name in ("api", "worker"):
        assert services[name]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
        assert services[name]["environment"]["TICKLER_MIGRATE_ON_START"] == "false"
    assert services["worker"]["command"][:2] == ["tickler", "worker"]


def test_compose_gives_each_service_its_own_healthcheck_and_commits_no_secret() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert services["migrate"]["healthcheck"] == {"disable": True}
    assert "8080/healthz" in " ".join(services["api"]["healthcheck"]["test"])
    port = services["worker"]["command"][services["worker"]["command"].index("--metrics-port") + 1]
    assert f"{port}/metrics" in " ".join(services["worker"]["healthcheck"]["test"])
    # Secrets are required variables, refused with a message when unset, never a value written here.
    environment = services["api"]["environment"]
    assert re.fullmatch(r"\$\{TICKLER_SECRET_KEY:\?[^}]+\}", environment["TICKLER_SECRET_KEY"])
    assert "${TICKLER_DB_PASSWORD:?" in environment["TICKLER_DATABASE_URL"]
    assert services["db"]["environment"]["POSTGRES_PASSWORD"].startswith("${TICKLER_DB_PASSWORD:?")
    for example in DEPLOY.glob("*.example"):
        for line in example.read_text().splitlines():
            if line.startswith("TICKLER_SECRET_KEY="):
                assert line == "TICKLER_SECRET_KEY=", (example, line)  # no placeholder to leave in place


def _unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(re.sub(r"\\\n\s*", " ", (DEPLOY / "systemd" / name).read_text()))
    return parser


def test_the_systemd_units_run_the_documented_commands() -> None:
    api = _unit("tickler-api.service")["Service"]
    assert "tickler.wsgi:app" in api["ExecStart"] and "tickler.api.gunicorn_logging.Logger" in api["ExecStart"]
    for unit in ("tickler-api.service", "tickler-worker@.service"):  # (several Environment= lines)
        assert "\nEnvironment=TICKLER_MIGRATE_ON_START=false\n" in (DEPLOY / "systemd" / unit).read_text()
    worker = _unit("tickler-worker@.service")["Service"]
    assert worker["ExecStart"].split()[1:3] == ["worker", "--name"]
    assert worker["KillSignal"] == "SIGTERM" and int(worker["TimeoutStopSec"]) > 10  # beyond the grace
    migrate = _unit("tickler-migrate.service")["Service"]
    assert migrate["Type"] == "oneshot" and migrate["ExecStart"].endswith("tickler migrate")


HARDENING = {
    "NoNewPrivileges": "true",
    "ProtectSystem": "strict",
    "ProtectHome": "true",
    "PrivateTmp": "true",
    "PrivateDevices": "true",
    "CapabilityBoundingSet": "",
    "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    "RestrictNamespaces": "true",
    "SystemCallArchitectures": "native",
}


def test_the_units_are_sandboxed_and_the_guide_gives_their_exposure() -> None:
    guide = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        text = path.read_text()
        service = _unit(path.name)["Service"]
        for name, value in HARDENING.items():
            assert f"\n{name}={value}\n" in text, (path.name, name)
        assert "\nSystemCallFilter=@system-service\n" in text, path.name
        if shutil.which("systemd-analyze"):
            analysed = subprocess.run(
                ["systemd-analyze", "security", "--offline=true", str(path)], capture_output=True, text=True
            )
            exposure = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", analysed.stdout)
            assert exposure, analysed.stdout + analysed.stderr
            # What the guide records is what the unit scores now.
            assert f"| `{path.name}` | {exposure[1]} {exposure[2]} |" in guide, exposure.group(0)
        assert service["User"] == "tickler"


def test_the_deploy_guide_names_every_file_it_ships() -> None:
    guide = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.name != ".env":  # a deployment's own secrets, never committed
            assert path.relative_to(DEPLOY.parent).as_posix() in guide, path


def test_the_running_release_stays_ready_when_the_next_one_migrates_first(admin_url: str, tmp_path: Path) -> None:
    """The upgrade order of docs/deploy.md: migrations first, while this release still serves
    (and a rollback of the code alone): /readyz stays 200; `tickler migrate` of this release
    still refuses to touch the newer schema, in one line."""
    url = pg.create_database(admin_url, prefix="tickler_upgrade")
    try:
        migrate(url)
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO tickler_migration (version, name, checksum) VALUES (9999, 'from_the_future', 'x')"
            )
        app = create_app(Settings(database_url=url, migrate_on_start=False, pool_size=1), configure_logs=False)
        try:
            assert app.test_client().get("/readyz").status_code == 200
        finally:
            close_app(app)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TICKLER_")} | {"TICKLER_DATABASE_URL": url}
        refused = subprocess.run(
            [sys.executable, "-m", "tickler.cli", "migrate"], env=env, capture_output=True, text=True, timeout=60
        )
        assert refused.returncode == 2 and "9999" in refused.stderr and "Traceback" not in refused.stderr
    finally:
        pg.drop_database(admin_url, url)
