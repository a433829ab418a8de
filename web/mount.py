"""Placing the UI in an ASGI app: at `/ui` of the service (`mount_ui`), or alone (`standalone_app`).

Mounted, the UI calls the same server's API over loopback HTTP, exactly as a remote UI does.
"""
from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import gradio as gr
from fastapi import FastAPI

from web.config import MountConfig
from web.files import enforce_file_checks, file_policy
from web.ui import CSS, StyleVARUI, UIConfig

log = logging.getLogger("web")


def loopback_url(host: str, port: int) -> str:
    if port == 0:
        raise ValueError("the mounted UI needs the service's port: start it with a fixed --port, or with --no-ui")
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:  # a host name such as localhost
        return f"http://{host}:{port}"
    if addr.is_unspecified:
        addr = ipaddress.ip_address("::1" if addr.version == 6 else "127.0.0.1")
    return f"http://[{addr}]:{port}" if addr.version == 6 else f"http://{addr}:{port}"


def _key_auth(keys: list[str]) -> Callable[[str, str], bool]:
    """Gradio login: any user name, an API key as the password (constant-time compare with every key)."""
    encoded = [k.encode() for k in keys]

    def check(_user: str, password: str) -> bool:
        given = password.encode("utf-8", "surrogateescape")
        found = False
        for key in encoded:  # no early exit: the time does not tell which key matched
            found |= hmac.compare_digest(given, key)
        return found
    return check


def mount(app: FastAPI, ui: StyleVARUI, path: str, *, max_file_size: int | None = None,
          api_keys: list[str] | None = None, blocked: Iterable[str | Path] = (), **kwargs: Any) -> FastAPI:
    """Mount the UI on `app` at `path`, reading no server file but uploads and examples (`blocked`: more folders
    it may never read). The path is also Gradio's `root_path`, or an example's click links files wrongly (404)."""
    blocks = ui.blocks()
    policy = file_policy(blocked)
    app = gr.mount_gradio_app(
        app, blocks, path=path, root_path=path.rstrip("/"), css=CSS, allowed_paths=policy.allowed,
        blocked_paths=policy.blocked,
        max_file_size=max_file_size, auth=_key_auth(api_keys) if api_keys else None,
        auth_message="This service needs an API key: enter it as the password (any user name)." if api_keys else None,
        ssr_mode=False, pwa=False, footer_links=["api", "gradio"], **kwargs,
    )
    enforce_file_checks(blocks)
    return app


def mount_ui(app: FastAPI, config: MountConfig) -> None:
    """The UI at `config.path` of the service, calling its API on loopback (with its first API key, if any)."""
    api_url = loopback_url(config.host, config.port)
    keys = list(config.api_keys)
    ui_config = UIConfig(api_url=api_url, api_key=keys[0] if keys else None, timeout_s=config.timeout_s)
    mount(app, StyleVARUI(ui_config), config.path, max_file_size=config.max_upload_bytes, api_keys=keys,
          blocked=config.blocked)
    log.info("UI mounted at %s (API at %s)", config.path, api_url)


def standalone_app(config: UIConfig, *, path: str = "/") -> FastAPI:
    app = FastAPI(title=f"{config.title} UI", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return mount(app, StyleVARUI(config), path)
