"""`GET /docs` (Swagger UI) and `GET /redoc` (ReDoc), their scripts and styles served by the service itself from
the `fastapi-offline` package: the pages work where the browser reaches the service and nothing else."""
from __future__ import annotations

from pathlib import Path

import fastapi_offline  # only its files are used
from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from serve.http.errors import ServiceError

DOCS_PATH, REDOC_PATH, ASSETS_PATH = "/docs", "/redoc", "/docs/assets"
ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
FOLDER = Path(fastapi_offline.__file__).parent / "static"


def install(app: FastAPI) -> None:
    """Add /docs, /redoc and their files to ``app`` (whose document is at ``app.openapi_url``)."""
    title, spec = app.title, app.openapi_url or ""
    router = APIRouter(include_in_schema=False)

    @router.get(DOCS_PATH)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=spec, title=f"{title} - Swagger UI",
                                   swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
                                   swagger_ui_parameters={"validatorUrl": None})  # no online validator badge

    @router.get(REDOC_PATH)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=spec, title=f"{title} - ReDoc",
                              redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
                              redoc_favicon_url=f"{ASSETS_PATH}/favicon.png", with_google_fonts=False)

    @router.get(f"{ASSETS_PATH}/{{name}}")
    async def asset(name: str) -> FileResponse:
        if name not in ASSETS:
            raise ServiceError(404, "not_found", f"no file {name!r} under {ASSETS_PATH}")
        return FileResponse(FOLDER / name, headers={"Cache-Control": "public, max-age=86400"})

    app.include_router(router)
    app.docs_url, app.redoc_url = DOCS_PATH, REDOC_PATH
