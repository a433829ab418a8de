"""Structured logging: one JSON object per line, each carrying the request id of its request.

The request middleware sets the id in a context variable; the model worker names its jobs' ids in `extra`.
"""
from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import re
import sys
import uuid

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("stylevar_request_id", default=None)

_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# attributes every LogRecord has; anything else was passed in `extra` and is logged as a field
_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName", "color_message"}


def new_request_id(offered: str | None = None) -> str:
    """The client's X-Request-ID if it is a sane token, else a fresh one."""
    if offered and _VALID_REQUEST_ID.fullmatch(offered):
        return offered
    return uuid.uuid4().hex


def _fields(record: logging.LogRecord) -> dict:
    out = {
        "ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
        "level": record.levelname,
        "logger": record.name,
        "msg": record.getMessage(),
        "request_id": getattr(record, "request_id", None) or request_id_var.get(),
    }
    for key, value in vars(record).items():
        if key not in _RECORD_FIELDS and key not in out:
            out[key] = value
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), default=str)


class TextFormatter(logging.Formatter):
    """Human-readable lines for a terminal, still with the request id."""

    def format(self, record: logging.LogRecord) -> str:
        f = _fields(record)
        skip = ("ts", "level", "logger", "msg", "exc", "request_id")
        extra = " ".join(f"{k}={v}" for k, v in f.items() if k not in skip)
        line = f"{f['ts']} {f['level']:<7} [{f['request_id'] or '-'}] {f['logger']}: {f['msg']}"
        line = f"{line} {extra}" if extra else line
        return f"{line}\n{f['exc']}" if "exc" in f else line


def configure_logging(json_lines: bool = True, level: str = "INFO") -> None:
    """Route the root logger (uvicorn's too) to stderr in the chosen format; only `python -m serve` calls this."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
