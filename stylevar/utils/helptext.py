"""How every command's ``--help`` reads: the one formatter of the project's parsers (a default shown once, required
options said so, reST markup as plain text). Standard library only.
"""
from __future__ import annotations

import argparse
import re
from pathlib import PurePath
from typing import Any

DEVICE_AUTO = "CUDA if available, else the CPU"  # the device every command picks when --device is left out

_SAYS_DEFAULT = re.compile(r"\bdefaults?\b|%\(default\)", re.IGNORECASE)
_SAYS_REQUIRED = re.compile(r"\brequired\b", re.IGNORECASE)
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]+?)(?:\s*<[^`>]*>)?`")


def plain(text: str) -> str:
    """``text`` without reST markup: ``literal`` -> `literal`, :role:`~a.b.Name` -> `Name`."""
    text = _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)
    return _LITERAL.sub(r"`\1`", text)


def default_text(value: Any, sep: str = " ") -> str | None:
    """How a default reads on the command line (a list: its items as one would type them, ``sep`` between
    them); None for a default that says nothing (None, False, an empty string or list, argparse's SUPPRESS)."""
    if value is None or value is False or value is argparse.SUPPRESS:
        return None
    if isinstance(value, (list, tuple)):
        return sep.join(str(v) for v in value) or None
    if isinstance(value, PurePath):
        return str(value)
    return str(value) or None


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter with each default shown once, "(required)" and plain-text descriptions."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if text == argparse.SUPPRESS:
            return text
        text = plain(text)
        if action.option_strings and action.required:
            return text if _SAYS_REQUIRED.search(text) else f"{text} (required)".lstrip()
        takes_value = action.nargs != 0
        optional_positional = not action.option_strings and action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)
        if not takes_value or not (action.option_strings or optional_positional) or _SAYS_DEFAULT.search(text):
            return text
        # a list typed as several words (nargs), or as one (a type that splits "LO,HI")
        shown = default_text(action.default, " " if action.nargs not in (None, argparse.OPTIONAL) else ",")
        if shown is None:
            return text
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))


class RawDescriptionHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """:class:`HelpFormatter` keeping the description's and the epilog's own line breaks."""
