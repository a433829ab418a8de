"""``python -m stylevar.evaluate ARGS`` is ``stylevar evaluate ARGS``; sharded over N processes:
``torchrun --nproc-per-node N -m stylevar.evaluate ARGS``."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from stylevar.cli import main as cli_main
    return cli_main(["evaluate", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
