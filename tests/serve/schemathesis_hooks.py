"""Schemathesis hooks of tests/serve/test_fuzz.py, loaded by its command line (`SCHEMATHESIS_HOOKS`): what the
OpenAPI document cannot say, given to the generated requests (docs/serving.md, "Generated clients").

- Every file field's bytes are a real file (the folder `STYLEVAR_FUZZ_FILES` holds them): an image, a mask, a clip.
- A schema-valid request's counts agree across its fields, one weight and one mask per style (JSON Schema relates
  no field's length to another's): the styles are as many as the weights, the masks as the styles.
- A refused-data failure where the tool sent a boolean field as the number 0 or 1 is dropped: in multipart every
  value is text, and "0" / "1" are booleans' texts (as in HTML forms and pydantic), not a wrong type.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import schemathesis
from schemathesis.transport.serialization import Binary

FILES = {"content": "content.png", "style": "style.png", "style_mask": "mask.png", "video": "video.mp4"}
BOOLEANS = ("preserve_color", "fast")


def use_real_file(name: str, value: Any) -> None:
    """The field's bytes (each item's, for a list) made the real file's; anything else is kept (text or a number
    where a file belongs)."""
    data = (Path(os.environ["STYLEVAR_FUZZ_FILES"]) / FILES[name]).read_bytes()
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, Binary):
            item.data = data


def weights_count(text: Any) -> int | None:
    """How many weights `style_weights` gives (None: left out, or not a list of them)."""
    if not isinstance(text, str) or not text.strip(" []"):
        return None
    return len(text.strip(" []").split(","))


def agree_counts(body: dict[str, Any]) -> None:
    styles = body.get("style")
    if not isinstance(styles, list) or not styles:
        return
    n = weights_count(body.get("style_weights")) or len(styles)
    body["style"] = (styles * n)[:n]
    if isinstance(body.get("style_mask"), list) and body["style_mask"]:
        body["style_mask"] = (body["style_mask"] * n)[:n]


@schemathesis.hook
def before_call(context, case, **kwargs) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    valid = case.meta is not None and not case.meta.generation.mode.is_negative
    for name in FILES.keys() & body.keys():
        use_real_file(name, body[name])
    if valid:
        agree_counts(body)
    # The case stays what it was generated as: the tool re-judges a body a hook edited, and judges any body with
    # a file in it as breaking the schema (its validator reads no bytes).
    case._record_starting_state()


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    body = case.body if isinstance(case.body, dict) else {}
    as_number = [name for name in BOOLEANS if type(body.get(name)) is int and body[name] in (0, 1)]
    return not (failure.code == "ST201" and any(f"{name}: Incorrect type" in failure.message for name in as_number))
