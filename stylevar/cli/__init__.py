"""The `stylevar` command.

One module per sub-command declares its arguments and imports the library only when it runs (`--help` never
imports torch); other packages add sub-commands through the ``stylevar.commands`` entry-point group. Every error
a user can cause is one line on stderr and a non-zero exit.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from stylevar.cli import bench, convert, evaluate, pull, stylize, weights
from stylevar.cli.command import EXIT_PARTIAL, EXIT_USAGE, Command, Parser
from stylevar.utils import threads

__all__ = ["EXIT_PARTIAL", "EXIT_USAGE", "ENTRY_POINT_GROUP", "build_parser", "commands", "main"]

ENTRY_POINT_GROUP = "stylevar.commands"
BUILTIN: tuple[Command, ...] = (convert.COMMAND, stylize.COMMAND, pull.COMMAND, bench.COMMAND, weights.COMMAND,
                                evaluate.COMMAND)


def commands() -> tuple[Command, ...]:
    """Every sub-command: the built-in ones, then those of the ``stylevar.commands`` entry points."""
    from importlib.metadata import entry_points
    added = []
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        cmd = point.load()
        if not isinstance(cmd, Command) or cmd.name != point.name:
            raise TypeError(f"entry point {point.name} = {point.value} ({ENTRY_POINT_GROUP}) is not a "
                            f"stylevar.cli.command.Command named {point.name!r}")
        added.append(cmd)
    return BUILTIN + tuple(added)


def _chosen(argv: Sequence[str]) -> str | None:
    """The sub-command named in ``argv`` (the first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: every command listed, the chosen one (None: all) with its full arguments."""
    from stylevar import __version__
    chosen = _chosen(argv) if argv is not None else None
    parser = Parser(prog="stylevar", description="StyleVAR: reference-based image style transfer. "
                                                 "`stylevar COMMAND --help` describes a command.")
    parser.add_argument("--version", action="version", version=f"stylevar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in commands():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if argv is None or cmd.name == chosen:
            cmd.arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    threads.prepare_environment()  # OpenMP's wait setting, before any command imports torch (stylevar.utils.threads)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError) as e:  # ImageError, CheckpointError, InputError, DeviceError ...
        print(f"stylevar {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
