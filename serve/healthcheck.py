"""`python -m serve.healthcheck [URL]`: exit 0 when /readyz answers 200 (default URL: the local `STYLEVAR_PORT`)."""
from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    url = argv[0] if argv else f"http://127.0.0.1:{os.environ.get('STYLEVAR_PORT', '8000')}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (local URL)
            ok = response.status == 200
    except (urllib.error.URLError, OSError) as e:
        print(f"not ready: {e}", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
