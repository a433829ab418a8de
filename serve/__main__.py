"""`python -m serve [--host H] [--port P] [--model DIR|hf:OWNER/NAME[@REVISION][:grpo|sft]] [--device D] [--no-ui]`.

Every option also has an environment variable (`STYLEVAR_<NAME>`); the command line wins. SIGTERM or SIGINT
drains the service (`serve.http.drain`) and exits with 0.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading

from pydantic import ValidationError

from stylevar.cli.command import Parser
from stylevar.loaders import hub
from stylevar.utils import threads
from stylevar.utils.listen import address_error, listening_socket

from serve.http.logs import configure_logging
from serve.settings import ServeSettings, env_name

SETTINGS_DOC = "docs/serving.md#settings"  # every setting, its default and what it does
FLAGS = {"host": "--host", "port": "--port", "model_dir": "--model", "device": "--device", "ui": "--no-ui"}


def _default(field: str) -> object:
    return ServeSettings.model_fields[field].default


def build_parser() -> Parser:
    others = ", ".join(env_name(f) for f in ServeSettings.model_fields if f not in FLAGS)
    p = Parser(  # an unknown option is named beside the nearest one (stylevar.cli.command)
        prog="python -m serve", description="StyleVAR inference service (API + UI)",
        epilog=f"Every option is also a setting, an environment variable STYLEVAR_<NAME> (an option given here wins); "
               f"the others are settings only: {others}. Every setting, its default and what it does: {SETTINGS_DOC}.")
    p.add_argument("--host", help=f"bind address ({env_name('host')}; default: {_default('host')})")
    p.add_argument("--port", type=int, help=f"port ({env_name('port')}; default: {_default('port')})")
    p.add_argument("--model", dest="model_dir",
                   help=f"model directory, or a hub id {hub.ID_FORM} (pulled on first use; "
                        f"{env_name('model_dir')}; default: the embedded demo model)")
    p.add_argument("--device", help="auto, cpu, cuda:0 or a comma-separated list, one model copy and worker each "
                                    f"({env_name('device')}; default: {','.join(_default('device'))}: every visible "
                                    "CUDA device, else the CPU)")
    p.add_argument("--no-ui", dest="ui", action="store_false", default=None,
                   help=f"do not mount the web UI at /ui ({env_name('ui')}=false)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # OpenMP's wait setting, before torch is imported (stylevar.utils.threads; the settings' default model path does)
    threads.prepare_environment()
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings = ServeSettings(**overrides)
    except ValidationError as e:
        print(f"invalid settings:\n{e}", file=sys.stderr)
        return 2
    try:  # the address first, held while the model loads: a port in use is one line now, not a log record later
        listener = listening_socket(settings.host, settings.port)
    except OSError as e:
        why = address_error(settings.host, settings.port, e, port_option=f"--port or {env_name('port')}")
        print(f"cannot start: {why}", file=sys.stderr)
        return 2
    settings = settings.model_copy(update={"port": listener.getsockname()[1]})  # --port 0: the one given
    configure_logging(settings.log_json, settings.log_level)
    log = logging.getLogger("serve")

    from stylevar.loaders.hub import HubError, is_hub_id
    from stylevar.loaders.model_dir import ModelDirError
    from stylevar.loaders.pull import resolve_model
    from serve.http.app import create_app, load_runners
    log.info("starting", extra={"host": settings.host, "port": settings.port, "model_dir": str(settings.model_dir),
                                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")})
    try:  # a hub id is pulled on first use, and the model loads before the server starts: what fails is one line
        if is_hub_id(settings.model_dir):
            settings = settings.model_copy(update={"model_dir": resolve_model(str(settings.model_dir))})
        app = create_app(settings)
        state = app.state.service
        load_runners(state)
    except (HubError, ModelDirError, ValueError) as e:
        listener.close()
        print(f"cannot start: {e}", file=sys.stderr)
        return 2
    return run_server(app, settings, listener)


def run_server(app, settings: ServeSettings, listener: socket.socket) -> int:
    """uvicorn over the loaded app, with the drain, on the address ``listener`` held; the ready line once the model
    is warm and the port listens."""
    import uvicorn
    from serve.http.connections import ConnectionPolicy, bounded_protocol
    from serve.http.drain import DrainingServer
    state = app.state.service
    lock, said = threading.Lock(), False

    def say_when_ready() -> None:  # once the model is warm and the port listens, whichever comes last
        nonlocal said
        with lock:
            if state.ready and server.started and not said:
                said = True
                say_ready(ready_line(app, settings))

    state.on_ready = say_when_ready
    # X-Forwarded-For only from STYLEVAR_FORWARDED_ALLOW_IPS (none by default; uvicorn's default trusts loopback)
    proxies = settings.forwarded_allow_ips
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, access_log=False,
                            proxy_headers=bool(proxies), forwarded_allow_ips=proxies or None,
                            timeout_graceful_shutdown=settings.drain_timeout_s,  # type: ignore[arg-type]
                            http=bounded_protocol(ConnectionPolicy.from_settings(settings),
                                                  on_refused=state.metrics.connection_refused))
    server = DrainingServer(config, state.drain, on_drain=state.begin_drain, on_started=say_when_ready)
    listener.close()  # uvicorn binds the address itself, an instant later
    try:
        server.run()
    except SystemExit as e:  # uvicorn's startup failure: its error record, then sys.exit(3)
        print(f"cannot start: the service did not start on {settings.host}:{settings.port} (its error is above)",
              file=sys.stderr)
        return e.code if isinstance(e.code, int) else 3
    return 0


def say_ready(line: str) -> None:
    """The ready line on stdout in one write, so that a log record written to the same file cannot split it."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def ready_line(app, settings: ServeSettings) -> str:
    """The precision the model runs in and where the UI, the API and its documentation are, said once the model is
    ready (beside the logs; its "model loaded" record says why that precision)."""
    from serve.http.routes.index import UI_PATH, ui_mounted
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(settings.host, settings.host)
    base = f"http://{f'[{host}]' if ':' in host and not host.startswith('[') else host}:{settings.port}"
    parts = [f"UI {base}{UI_PATH}"] if ui_mounted(app) else []
    parts += [f"API {base}/stylize"] + ([f"docs {base}{app.docs_url}"] if app.docs_url else [])
    runner = app.state.service.runner
    return f"StyleVAR ready ({runner.pipe.config.name}, {runner.precision.precision}): " + "  ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
