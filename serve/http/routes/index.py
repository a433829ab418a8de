"""`GET /`: a redirect to the web UI when it is mounted, else the API's index (which links to `/docs`)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse

import stylevar

UI_PATH = "/ui"  # where the web UI is mounted
ROUTES = ("POST /stylize", "POST /stylize/stream", "POST /stylize/video", "GET /v1/model", "GET /healthz",
          "GET /readyz", "GET /metrics")

router = APIRouter(tags=["operations"])


def ui_mounted(app: Any) -> bool:
    return any(getattr(route, "path", None) == UI_PATH for route in app.routes)


@router.get("/", include_in_schema=False, response_model=None)
async def index(request: Request) -> Any:
    """The UI (307 to /ui) when mounted; else the API's index: its version, documentation and routes."""
    if ui_mounted(request.app):
        return RedirectResponse(UI_PATH, status_code=307)
    docs = request.app.docs_url
    return {"service": "StyleVAR", "version": stylevar.__version__, "ui": None,
            "docs": docs, "openapi": request.app.openapi_url, "routes": list(ROUTES),
            "note": f"the API's documentation is at {docs}" if docs else "the API's documentation is off"}
