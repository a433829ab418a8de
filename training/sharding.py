"""A model directory from a sharded (``--strategy fsdp``) training.sft checkpoint: ``python -m training.sharding``.

The sharding itself (FSDP2, sharded checkpoints, the export) is `training.parts.fsdp`.
"""
from __future__ import annotations

import sys
from typing import Sequence

from stylevar.cli.command import Parser


def main(argv: Sequence[str] | None = None) -> int:
    p = Parser(prog="python -m training.sharding",
               description="a model directory from a sharded (--strategy fsdp) training.sft checkpoint")
    p.add_argument("checkpoint", help="RUN directory (its newest sharded checkpoint) or RUN/checkpoints/step-*.pt")
    p.add_argument("--out", required=True, help="output model directory")
    args = p.parse_args(argv)
    from training.parts.fsdp import export_model_dir  # torch: once the options are parsed
    try:
        out = export_model_dir(args.checkpoint, args.out)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
