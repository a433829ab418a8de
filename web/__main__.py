"""`python -m web --api URL [--host 127.0.0.1] [--port 7860] [--api-key KEY]`: the UI alone, for a remote service."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from stylevar.utils.helptext import HelpFormatter
from stylevar.utils.listen import address_error, listening_socket

PROBE_TIMEOUT_S = 3.0  # the one look at the service at start-up


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m web", description="StyleVAR web UI against a running service",
                                formatter_class=HelpFormatter)
    p.add_argument("--api", metavar="URL", help="base URL of the service, e.g. http://gpu-box:8000 (required)")
    p.add_argument("--host", default="127.0.0.1", help="bind address of the UI")
    p.add_argument("--port", type=int, default=7860, help="port of the UI")
    p.add_argument("--api-key", default=os.environ.get("STYLEVAR_API_KEY"),
                   help="the service's API key, sent as a Bearer token (default: the environment's STYLEVAR_API_KEY)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="longest wait for the service's next stream event, seconds")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.api is None:
        p.error("--api URL is required: the address of a running `python -m serve`, e.g. http://127.0.0.1:8000 "
                "(that service also serves this UI itself, at /ui)")
    if not args.api.startswith(("http://", "https://")):
        p.error(f"--api must be an http(s) URL, got {args.api!r}")
    try:  # the address first: a port in use is one line, not a log record after the UI is built
        listener = listening_socket(args.host, args.port)
    except OSError as e:
        p.error(f"cannot start: {address_error(args.host, args.port, e)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import uvicorn
    from web.client import ServiceClient, ServiceError
    from web.mount import loopback_url, standalone_app
    from web.ui import UIConfig
    with ServiceClient(args.api, api_key=args.api_key, timeout_s=PROBE_TIMEOUT_S) as client:
        try:
            client.model_info()
        except ServiceError as e:  # the UI still starts: it asks the service again for every picture
            print(f"note: {e.message.rstrip('.')}; start it with `python -m serve` or check --api (the UI asks it "
                  "again for every picture)", file=sys.stderr)
    app = standalone_app(UIConfig(api_url=args.api, api_key=args.api_key, timeout_s=args.timeout))
    port = listener.getsockname()[1]
    listener.close()  # uvicorn binds the address itself, an instant later
    line = f"StyleVAR UI ready: {loopback_url(args.host, port)}/  (service: {args.api})"

    class Server(uvicorn.Server):  # says the line once the port listens
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:
                print(line, flush=True)

    Server(uvicorn.Config(app, host=args.host, port=port, log_level="warning")).run()  # a failure: sys.exit(3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
