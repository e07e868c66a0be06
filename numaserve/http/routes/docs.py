"""GET /docs: the API as a page to browse and try (Swagger UI, reading /openapi.json), served
whole by this server from the swagger-ui-py package's copy of Swagger UI. The page loads
nothing from anywhere else: its Content-Security-Policy lets it reach this server alone, and
Swagger UI's online validator badge is off. Its paths are relative, so it also works behind a
proxy that serves the API under a prefix."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve.front.errors import ApiError
from numaserve.http import api_errors
from numaserve.http.connection import Request, Response
from numaserve.http.routing import Route

if TYPE_CHECKING:
    from numaserve.http.app import App

PACKAGE = "swagger-ui-py"  # its module is swagger_ui; only its static files are read
SECURITY = (
    (
        "content-security-policy",
        "default-src 'self'; img-src 'self' data:; "
        "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
)
PAGE = b"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>numaserve API</title>
<link rel="icon" type="image/png" href="docs/favicon-32x32.png">
<link rel="stylesheet" href="docs/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="docs/swagger-ui-bundle.js"></script>
<script src="docs/start.js"></script>
</body>
</html>
"""
START = b"""window.onload = () => {
  window.ui = SwaggerUIBundle({
    url: "openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
};
"""
ASSETS = {  # path -> (Swagger UI's file, its content type)
    "/docs/swagger-ui.css": ("swagger-ui.css", "text/css; charset=utf-8"),
    "/docs/swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "/docs/favicon-32x32.png": ("favicon-32x32.png", "image/png"),
}


@cache
def swagger_ui_file(name: str) -> bytes:
    """One of Swagger UI's files, read once. The package is found, not imported: its own
    module would load jinja2 and a YAML parser this process has no use for."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise ApiError(404, f"the API page needs the {PACKAGE} package: pip install {PACKAGE}")
    return (Path(spec.submodule_search_locations[0]) / "static" / name).read_bytes()


def served(body: bytes, content_type: str) -> Response:
    headers = (*SECURITY, ("cache-control", "public, max-age=3600"))
    return Response(200, body, content_type, headers)


async def page(app: App, request: Request) -> Response:
    swagger_ui_file(ASSETS["/docs/swagger-ui-bundle.js"][0])  # a clear 404 if it is missing
    return served(PAGE, "text/html; charset=utf-8")


async def slash(app: App, request: Request) -> Response:
    """/docs/ is /docs: the page's own files are named from /docs."""
    return Response(308, b"", headers=(("location", "/docs"),))


async def start(app: App, request: Request) -> Response:
    return served(START, "text/javascript; charset=utf-8")


async def asset(app: App, request: Request) -> Response:
    name, content_type = ASSETS[request.path]
    return served(swagger_ui_file(name), content_type)


def _route(path: str, handler, summary: str) -> Route:
    return Route("GET", path, handler, api_errors.tei, summary, open=True, described=False)


ROUTES = (
    _route("/docs", page, "This API as a page to browse and try (Swagger UI)"),
    _route("/docs/", slash, "The page, at /docs"),
    _route("/docs/start.js", start, "The page's script"),
    *(_route(path, asset, "Swagger UI's own file") for path in ASSETS),
)
