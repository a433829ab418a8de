"""`python -m data_tools {synth,index,shards} ...`: the same as `python -m data_tools.<tool> ...`."""
from __future__ import annotations

import sys

TOOLS = ("synth", "index", "shards", "teach")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in TOOLS:
        print(f"usage: python -m data_tools {{{','.join(TOOLS)}}} [options]  (--help after the tool name)",
              file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    tool, rest = argv[0], argv[1:]
    if tool == "synth":
        from data_tools.synth import main as run
    elif tool == "index":
        from data_tools.index import main as run
    elif tool == "shards":
        from data_tools.shards import main as run
    else:
        from data_tools.teach import main as run
    return run(rest)


if __name__ == "__main__":
    raise SystemExit(main())
