"""What a `stylevar` sub-command declares, the parser it gets, and the command's exit codes."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

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
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")
