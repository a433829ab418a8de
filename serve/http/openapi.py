"""The service's OpenAPI document (`/openapi.json`) shaped once for generated clients (`install(app, shape)`).

Each multipart body becomes one plain object (FastAPI's `allOf` merged; closed unless unknown fields are allowed),
each file is `format: binary` too, list options fit the served model, every answer declares `X-Request-ID`, and
the bearer security and 401/429 answers appear only where the service has API keys.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from stylevar.processing.postprocess import MAX_STYLES

from serve.http.schemas import response_headers

Schema = dict[str, Any]
KEY_ONLY_STATUSES = ("401", "429")  # a missing or wrong key, too many wrong keys
SEP = " *, *"
UNIT = r"(?:0(?:\.[0-9]{1,6})?|1(?:\.0{1,6})?)"  # a number in [0, 1], as text and as JSON
WEIGHT = r"(?:0|[1-9][0-9]{0,5})(?:\.[0-9]{1,6})?"  # a number >= 0, finite in float32
ZERO = r"0(?:\.0{1,6})?"
NONZERO = r"(?:[1-9][0-9]{0,5}(?:\.[0-9]{1,6})?|0\.[0-9]{0,5}[1-9][0-9]{0,5})"


@dataclass(frozen=True)
class DocumentShape:
    """What the shaped document depends on: the service's keys and the served model's scale count."""

    keys: bool  # the service has API keys
    scales: int  # the served model's scale count (one alpha each)
    closed_forms: bool = True  # a form field a route does not declare is refused (STYLEVAR_ALLOW_UNKNOWN_FIELDS off)


def list_pattern(items: str) -> str:
    """A list option's text: blank (left out), `items` comma-separated, or as a JSON list."""
    return f"^ *(?:|{items}| *\\[ *{items} *\\]) *$"


def alphas_pattern(scales: int) -> str:
    return list_pattern(f"{UNIT}(?:{SEP}{UNIT}){{{scales - 1}}}")


def weights_pattern(most: int = MAX_STYLES) -> str:
    """1 to `most` weights, not all 0: zeros, then one that is not, then any."""
    def branch(zeros: int) -> str:
        before = f"(?:{ZERO}{SEP}){{{zeros}}}" if zeros else ""
        after = f"(?:{SEP}{WEIGHT}){{0,{most - 1 - zeros}}}" if zeros < most - 1 else ""
        return before + NONZERO + after

    return list_pattern(f"(?:{'|'.join(branch(zeros) for zeros in range(most))})")


def alphas_example(scales: int) -> str:
    """One alpha per scale, more of the style at the finer scales."""
    return ",".join(f"{0.2 + 0.5 * i / max(1, scales - 1):.2f}" for i in range(scales))


def operations(spec: Schema) -> Iterator[Schema]:
    for path in spec.get("paths", {}).values():
        yield from (op for method, op in path.items() if isinstance(op, dict) and "responses" in op)


def referenced(schemas: Schema, schema: Schema) -> Schema:
    ref = schema.get("$ref", "")
    return schemas[ref.rsplit("/", 1)[1]] if ref.startswith("#/components/schemas/") else schema


def form_bodies(spec: Schema) -> Iterator[Schema]:
    """The schema of each multipart body (a component), once each."""
    schemas, seen = spec["components"]["schemas"], set()
    for op in operations(spec):
        schema = op.get("requestBody", {}).get("content", {}).get("multipart/form-data", {}).get("schema")
        if schema is not None and id(body := referenced(schemas, schema)) not in seen:
            seen.add(id(body))
            yield body


def flatten_forms(spec: Schema, closed: bool) -> None:
    """Each multipart body's `allOf` form models merged into its properties (`closed`: no others), the models gone."""
    schemas, merged = spec["components"]["schemas"], set()
    for body in form_bodies(spec):
        if closed:
            body["additionalProperties"] = False
        for part in body.pop("allOf", ()):
            form = referenced(schemas, part)
            merged.add(part.get("$ref", "").rsplit("/", 1)[-1])
            body["properties"] = {**body.get("properties", {}), **form.get("properties", {})}
            body["required"] = [*body.get("required", ()), *form.get("required", ())]
            body.setdefault("description", form.get("description", ""))
        if not body.get("required"):
            body.pop("required", None)
    text = json.dumps(spec)
    for name in merged - {""}:
        if f'"#/components/schemas/{name}"' not in text:
            del schemas[name]


def mark_binary(schema: Any) -> None:
    """`format: binary` beside each `contentMediaType` of a string: a file, for OpenAPI 3.0's readers."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" and schema.get("contentMediaType") == "application/octet-stream":
            schema.setdefault("format", "binary")
        for value in schema.values():
            mark_binary(value)
    elif isinstance(schema, list):
        for value in schema:
            mark_binary(value)


def fit_list_options(spec: Schema, scales: int) -> None:
    """The list options' pattern and example, for the served model: a schema's example is one the service takes."""
    fits = {"alphas": (alphas_pattern(scales), alphas_example(scales)), "style_weights": (weights_pattern(), "1")}
    for body in form_bodies(spec):
        for name, (pattern, example) in fits.items():
            if name in body.get("properties", {}):
                body["properties"][name].update(pattern=pattern, examples=[example])


def declare_security(spec: Schema, keys: bool) -> None:
    """Every answer carries `X-Request-ID`; without keys no operation asks for one, nor answers 401 or 429."""
    for op in operations(spec):
        for answer in op["responses"].values():
            answer["headers"] = {**response_headers("X-Request-ID"), **answer.get("headers", {})}
        if not keys:
            op.pop("security", None)
            for status in KEY_ONLY_STATUSES:
                op["responses"].pop(status, None)
    if not keys:
        spec.get("components", {}).pop("securitySchemes", None)


def shaped(spec: Schema, shape: DocumentShape) -> Schema:
    """FastAPI's document, shaped for generated clients (in place; returned)."""
    flatten_forms(spec, shape.closed_forms)
    mark_binary(spec["components"]["schemas"])
    fit_list_options(spec, shape.scales)
    declare_security(spec, shape.keys)
    return spec


def install(app: Any, shape: DocumentShape) -> None:
    """Have `app` serve its document shaped (built once, on the first request for it, then kept)."""
    document: Callable[[], Schema] = app.openapi

    def openapi() -> Schema:
        if app.openapi_schema is None:
            app.openapi_schema = shaped(document(), shape)
        return app.openapi_schema

    app.openapi = openapi
