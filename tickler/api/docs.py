"""/docs: the OpenAPI document rendered by Swagger UI, offline.

Swagger UI's files come from the `flask-swagger-ui` wheel (its `dist/`: Swagger UI 5, which reads
OpenAPI 3.1, under the Apache 2.0 licence, served at /docs/assets/LICENSE). Nothing is fetched
from another host: the page, its script and its styles are all served here, and the
Content-Security-Policy allows this origin only, so the page works on a machine without internet.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from flask import Blueprint, Response, send_from_directory
from werkzeug.exceptions import NotFound

bp = Blueprint("docs", __name__)

# The only files of Swagger UI's distribution that are served (no source maps, no templates).
ASSETS = frozenset(
    {"swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-standalone-preset.js", "favicon-32x32.png", "LICENSE"}
)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>tickler API</title>
  <link rel="stylesheet" href="/docs/assets/swagger-ui.css">
  <link rel="icon" type="image/png" href="/docs/assets/favicon-32x32.png">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="/docs/assets/swagger-ui-bundle.js"></script>
  <script src="/docs/assets/swagger-ui-standalone-preset.js"></script>
  <script src="/docs/init.js"></script>
</body>
</html>
"""

# In a file of its own, not inline: the CSP allows scripts from this origin only.
INIT = """window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
    layout: "StandaloneLayout"
  });
});
"""


def _dist() -> Path:
    return Path(str(resources.files("flask_swagger_ui").joinpath("dist")))


def _secured(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@bp.get("/docs")
def docs() -> Response:
    return _secured(Response(PAGE, mimetype="text/html"))


@bp.get("/docs/init.js")
def init() -> Response:
    return _secured(Response(INIT, mimetype="text/javascript"))


@bp.get("/docs/assets/<name>")
def asset(name: str) -> Response:
    if name not in ASSETS:
        raise NotFound(f"No asset {name!r}.")
    response = send_from_directory(_dist(), name, max_age=3600)
    if name == "LICENSE":
        response.mimetype = "text/plain"
    return _secured(response)
