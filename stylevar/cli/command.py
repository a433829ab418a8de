"""What a `stylevar` sub-command declares, the parser it gets, and the command's exit codes."""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from stylevar.utils.errors import did_you_mean, unknown_name
from stylevar.utils.helptext import HelpFormatter

EXIT_USAGE = 2  # a bad argument or input, found before the work
EXIT_PARTIAL = 1  # some inputs were skipped (listed on stderr); the others were written


@dataclass(frozen=True)
class Command:
    """A sub-command: its name, its one-line help, and the function that adds its arguments (and its
    ``func``, the function that runs it) to its parser. The module that declares it imports no torch."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]


class Parser(argparse.ArgumentParser):
    """argparse, with each usage error as one line (no usage block) and the project's help formatter
    (`stylevar.utils.helptext`); the sub-commands' parsers are Parsers too."""

    def __init__(self, *args, formatter_class: type[argparse.HelpFormatter] = HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str) -> NoReturn:
        if choice := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message):  # a command, a value
            message += did_you_mean(choice[1], (c.strip(" '") for c in choice[2].split(",")))
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """argparse's, but first an unknown long option is named beside the nearest one it or the sub-command takes."""
        argv = list(sys.argv[1:] if args is None else args)
        words = argv[:argv.index("--")] if "--" in argv else argv
        chain = chosen_parsers(self, words)
        known = [name for parser in chain for name in parser._option_string_actions]
        unknown = [name for name in (w.split("=", 1)[0] for w in words if w.startswith("--"))
                   if not any(k.startswith(name) for k in known)]  # a prefix of one is argparse's to resolve
        if unknown:
            chain[-1].error("; ".join(unknown_name("option", name, known) for name in unknown))
        return super().parse_args(argv, namespace)


def chosen_parsers(parser: argparse.ArgumentParser, words: list[str]) -> list[argparse.ArgumentParser]:
    """``parser`` and the sub-command parsers ``words`` choose below it, outermost first."""
    chain = [parser]
    while True:
        subs = [a for a in chain[-1]._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = next((subs[0].choices[w] for w in words if subs and w in subs[0].choices), None)
        if chosen is None:
            return chain
        chain.append(chosen)
