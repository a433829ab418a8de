"""How the surfaces see the stylize options: an `Option` per field of `stylevar.pipelines.request.StylizeRequest`
read from the field (type, default, range, help) and its `Offer` (label, surfaces, UI steps). No torch here.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from annotated_types import Ge, Le
from pydantic.fields import FieldInfo

from stylevar.pipelines.request import (CLI, EVERYWHERE, FORM, IMAGE_ONLY, PYTHON, UI, Offer, StylizeRequest)

__all__ = ["CLI", "DECLARED", "EVERYWHERE", "FORM", "IMAGE_ONLY", "PYTHON", "UI", "Option", "offered"]


@dataclass(frozen=True)
class Option(Offer):
    """One option as the surfaces offer it: its `Offer` with what its field declares."""

    name: str = ""
    help: str = ""  # what it does: the form field's description, the flag's help, the control's info
    type: Any = None  # the value's type, None left out (a Literal for a choice)
    optional: bool = False  # None is a value: the option left out
    default: Any = None
    ge: float | None = None  # the smallest value (of each number, for a list option)
    le: float | None = None  # the largest (the library's; `served_le` the service's where lower)

    @property
    def choices(self) -> tuple[str, ...]:
        return typing.get_args(self.type) if typing.get_origin(self.type) is Literal else ()

    @property
    def is_list(self) -> bool:
        return typing.get_origin(self.type) is tuple

    @property
    def number(self) -> type | None:
        """int or float for a number or a list of numbers; None otherwise."""
        kind = typing.get_args(self.type)[0] if self.is_list else self.type
        kind = typing.get_args(kind)[0] if typing.get_origin(kind) is typing.Annotated else kind
        return kind if kind in (int, float) else None

    @property
    def form_le(self) -> float | None:
        """The largest value the service and the UI take."""
        return self.le if self.served_le is None else self.served_le

    def on(self, surface: str) -> bool:
        return surface in self.surfaces

    def describe(self, absent: str, encoding: str = "") -> str:
        """The help text with what leaving it out means (``absent``: "absent", "default")."""
        return f"{self.help}{encoding}; {absent}: {self.unset}" if self.unset else f"{self.help}{encoding}"


def option_of(name: str, info: FieldInfo) -> Option:
    """The `Option` of one field of `StylizeRequest`."""
    offer = next(m for m in info.metadata if isinstance(m, Offer))
    kind = info.annotation
    optional = typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in typing.get_args(kind)
    if optional:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    metadata = list(info.metadata)
    if typing.get_origin(kind) is tuple:  # a list option's range is its items'
        item = typing.get_args(kind)[0]
        metadata += [m for meta in typing.get_args(item)[1:] if isinstance(meta, FieldInfo) for m in meta.metadata]
    ge = next((m.ge for m in metadata if isinstance(m, Ge)), None)
    le = next((m.le for m in metadata if isinstance(m, Le)), None)
    return Option(**{f.name: getattr(offer, f.name) for f in dataclasses.fields(Offer)}, name=name,
                  help=info.description or "", type=kind, optional=optional, default=info.default, ge=ge, le=le)


DECLARED: Mapping[str, Option] = MappingProxyType(
    {name: option_of(name, info) for name, info in StylizeRequest.model_fields.items()})  # in the declaration's order


def offered(surface: str) -> list[Option]:
    """The options a surface offers (FORM, CLI, UI, PYTHON), in the declaration's order."""
    return [opt for opt in DECLARED.values() if opt.on(surface)]
