"""`CodedError`: the base of the errors that carry a `code`, a short machine-readable reason beside the message
(the service answers it as `{"error": code}`; the UI and the command line choose their advice by it).
"""
from __future__ import annotations


class CodedError(Exception):
    """An error with a `code` (a short machine-readable reason) beside its message."""

    code: str = "error"

    def __init__(self, message: str = "", *, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
