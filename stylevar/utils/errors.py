"""`CodedError`: the base of the errors that carry a `code`, a short machine-readable reason beside the message
(the service answers it as `{"error": code}`; the UI and the command line choose their advice by it).
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable


class CodedError(Exception):
    """An error with a `code` (a short machine-readable reason) beside its message."""

    code: str = "error"

    def __init__(self, message: str = "", *, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """"; did you mean 'CLOSEST'?" where one of ``known`` is close to ``name`` (difflib), else ""."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def unknown_name(kind: str, name: str, known: Iterable[str]) -> str:
    """"unknown KIND 'NAME'", with `did_you_mean`'s hint."""
    return f"unknown {kind} {name!r}" + did_you_mean(name, known)
