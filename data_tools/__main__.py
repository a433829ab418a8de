"""`python -m data_tools {synth,index,shards,teach} ...`: the same as `python -m data_tools.<tool> ...`."""
from __future__ import annotations

import importlib
import sys

TOOLS = ("synth", "index", "shards", "teach")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in TOOLS:
        print(f"usage: python -m data_tools {{{','.join(TOOLS)}}} [options]  (--help after the tool name)",
              file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return importlib.import_module(f"data_tools.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
