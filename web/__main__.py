"""`python -m web --api URL [--host 127.0.0.1] [--port 7860] [--api-key KEY]`: the UI alone, for a remote service."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from stylevar.utils.helptext import HelpFormatter


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m web", description="StyleVAR web UI against a running service",
                                formatter_class=HelpFormatter)
    p.add_argument("--api", required=True, metavar="URL", help="base URL of the service, e.g. http://gpu-box:8000")
    p.add_argument("--host", default="127.0.0.1", help="bind address of the UI")
    p.add_argument("--port", type=int, default=7860, help="port of the UI")
    p.add_argument("--api-key", default=os.environ.get("STYLEVAR_API_KEY"),
                   help="the service's API key, sent as a Bearer token (default: the environment's STYLEVAR_API_KEY)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="longest wait for the service's next stream event, seconds")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.api.startswith(("http://", "https://")):
        print(f"error: --api must be an http(s) URL, got {args.api!r}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import uvicorn
    from web.mount import standalone_app
    from web.ui import UIConfig
    app = standalone_app(UIConfig(api_url=args.api, api_key=args.api_key, timeout_s=args.timeout))
    logging.getLogger("web").info("UI on http://%s:%d, service at %s", args.host, args.port, args.api)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
