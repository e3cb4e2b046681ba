"""Install the client into a fresh virtualenv and check that it brings nothing but itself and
`httpx` (with httpx's own small dependencies) — nothing of the server, and not the outbox's
database driver, which is the optional extra `tickler-client[outbox]`.

    python3 clients/python/check_install.py      # exits 1, naming the extra packages, otherwise
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The client, its one dependency and what httpx itself needs; pip and setuptools come with venv.
ALLOWED = {
    "tickler-client",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "sniffio",
    "certifi",
    "idna",
    "typing-extensions",
    "pip",
    "setuptools",
}
SERVER = {"tickler", "flask", "sqlalchemy", "psycopg", "psycopg-binary", "pyspark", "marshmallow", "apscheduler"}


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tickler-client-venv-") as directory:
        venv = Path(directory) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(HERE)], check=True)
        listed = subprocess.run(
            [str(python), "-m", "pip", "list", "--format=json"], check=True, capture_output=True, text=True
        ).stdout
        installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed)}
        probe = "import sys, tickler_client; print(sorted(m for m in sys.modules if m.split('.')[0] in %r))"
        leaked = subprocess.run(
            [str(python), "-c", probe % ({m.replace("-", "_") for m in SERVER},)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    extra, server = installed - ALLOWED, installed & SERVER
    print(f"installed: {', '.join(sorted(installed))}")
    if extra or server or leaked != "[]":
        print(f"unexpected packages: {sorted(extra | server)}; server modules imported: {leaked}", file=sys.stderr)
        return 1
    print("ok: the client installs alone with httpx, and imports nothing of the server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
