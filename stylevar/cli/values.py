"""argparse types for numbers in a range: each bad value is one line naming the bound."""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from stylevar.utils.threads import parse_threads  # no torch


def number(text: str, kind: type) -> float | int:
    """``text`` as an int or a finite float (argparse.ArgumentTypeError otherwise)."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def float_in(lo: float, hi: float, note: str = "") -> Callable[[str], float]:
    """An argparse type: a float in [lo, hi]."""

    def parse(text: str) -> float:
        value = float(number(text, float))
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo:g}, {hi:g}]{note}, got {text}")
        return value

    return parse


def int_in(lo: int, hi: int | None = None, note: str = "") -> Callable[[str], int]:
    """An argparse type: an integer >= lo (and <= hi when given)."""

    def parse(text: str) -> int:
        value = int(number(text, int))
        if value < lo or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}{note}, got {text}")
        return value

    return parse


def threads_argument(text: str) -> int | str | None:
    """--threads' type: a count, "auto" (None: the policy) or "torch" (`stylevar.utils.threads.parse_threads`)."""
    try:
        return parse_threads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
