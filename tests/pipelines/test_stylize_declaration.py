"""The stylize options are declared once (`stylevar.pipelines.request.StylizeRequest`): the service's form, the web client, the UI's
controls and the command line's flags offer exactly the declared options, with the declared defaults and ranges.

Each surface's names are read from what that surface really exposes (the OpenAPI schema, the client's form
encoding, the Gradio endpoint and page, the argparse parser) and compared with the declaration; a declaration
with one option more or one less is reported for every surface (so the comparison can fail).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from collections.abc import Mapping

import numpy as np
import pytest
from PIL import Image

from fastapi.exceptions import RequestValidationError

from serve.http.app import create_app
from serve.http.schemas import StylizeForm
from serve.settings import ServeSettings
from stylevar import cli
from stylevar.config import DEFAULT_GENERATION, GenerationConfig
from stylevar.pipelines.options import CLI, DECLARED, EVERYWHERE, FORM, PYTHON, UI, Option
from stylevar.pipelines.request import RequestError, StylizeRequest
from tests.conftest import micro_configs
from tests.serve.test_openapi import FILE_FIELDS, form
from web.client import form_fields
from web.ui import MAX_SCALES, UIConfig, build_ui

# the UI offers a list option through controls of its own: the second style's weight, the per-scale sliders
UI_COMPOSED = {"style_weights": "style1_weight", "alphas": "custom_alphas"}


def every_option_set() -> StylizeRequest:
    """A value other than the default for every option (valid for each)."""
    return StylizeRequest(style_strength=0.25, seed=5, top_k=50, top_p=0.5, num_samples=2, alphas=(0.25, 0.75),
                          resize="pad", preserve_color=True, upsample="bicubic", format="webp",
                          style_weights=(0.5, 0.25), guidance=1.5, fast=True)


# ---- what each surface exposes ---------------------------------------------------------------------------
@functools.cache
def form_schema() -> dict:
    spec = create_app(ServeSettings()).openapi()
    return {k: v for k, v in form(spec, "/stylize")["properties"].items() if k not in FILE_FIELDS}


def client_fields() -> set[str]:
    return set(form_fields(every_option_set()))


@functools.cache
def ui_endpoint() -> tuple[set[str], dict[str, dict]]:
    """The `/stylize` endpoint's parameter names and the page's components by elem_id."""
    demo = build_ui(UIConfig(api_url="http://127.0.0.1:9"))
    params = {p["parameter_name"] for p in demo.get_api_info()["named_endpoints"]["/stylize"]["parameters"]}
    components = {c["props"].get("elem_id"): c for c in demo.get_config_file()["components"]}
    return params, components


def stylize_parser() -> argparse.ArgumentParser:
    parser = cli.build_parser(["stylize"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["stylize"]


def cli_flags() -> dict[str, argparse.Action]:
    return {a.option_strings[0][2:].replace("-", "_"): a for a in stylize_parser()._actions if a.option_strings}


def disagreements(declared: Mapping[str, Option]) -> list[str]:
    """Every option a surface offers that the declaration does not give it, and the reverse."""
    def on(surface: str) -> set[str]:
        return {name for name, opt in declared.items() if surface in opt.surfaces}

    names = set(declared) | set(DECLARED)
    params, _ = ui_endpoint()
    ui = {name for name in names if name in params} | {n for n, ctrl in UI_COMPOSED.items() if ctrl in params}
    surfaces = {
        "form (OpenAPI)": (set(form_schema()), on(FORM)),
        "form (model)": (set(StylizeForm.model_fields), on(FORM)),
        "client": (client_fields(), on(FORM)),
        "ui": (ui, on(UI)),
        "cli": ({name for name in cli_flags() if name in names}, on(CLI)),
    }
    out = []
    for surface, (offered, expected) in surfaces.items():
        out += [f"{surface} offers {n}, not declared for it" for n in sorted(offered - expected)]
        out += [f"{surface} lacks {n}" for n in sorted(expected - offered)]
    return out


# ---- the surfaces agree with the declaration ---------------------------------------------------------------
def test_every_surface_offers_the_declared_options():
    assert disagreements(DECLARED) == []


def test_the_comparison_sees_an_option_more_or_less():
    more = {**DECLARED, "sharpness": Option(help="x", name="sharpness", surfaces=EVERYWHERE)}
    found = disagreements(more)
    for surface in ("form (OpenAPI)", "form (model)", "client", "ui", "cli"):
        assert f"{surface} lacks sharpness" in found
    fewer = {name: opt for name, opt in DECLARED.items() if name != "guidance"}
    assert "cli offers guidance, not declared for it" in disagreements(fewer)
    hidden = {**DECLARED, "format": dataclasses.replace(DECLARED["format"], surfaces=frozenset({FORM}))}
    assert disagreements(hidden) == ["cli offers format, not declared for it"]


def test_the_form_has_the_declared_types_defaults_and_ranges():
    schema = form_schema()
    for name, opt in ((n, o) for n, o in DECLARED.items() if o.on(FORM)):
        field = schema[name]
        if opt.optional:
            assert "default" not in field, name  # a form cannot send null: absent is the default
        else:
            assert field["default"] == opt.default, name
        if opt.choices:
            assert tuple(field["enum"]) == opt.choices, name
        elif opt.is_list:
            assert field["type"] == "string" and field["maxLength"] == opt.max_chars, name
        elif opt.number is not None:
            assert (field.get("minimum"), field.get("maximum")) == (opt.ge, opt.form_le), name  # JSON Schema's words
            assert not {"ge", "le"} & set(field), name
        assert field["description"].startswith(opt.help), name


def test_the_client_encodes_what_the_service_reads():
    options = every_option_set()
    assert StylizeForm(**form_fields(options)).request() == options
    assert StylizeForm(**form_fields(StylizeRequest())).request() == StylizeRequest()


def test_the_ui_controls_start_and_end_where_the_declaration_says():
    params, components = ui_endpoint()
    assert {f"alpha_{k + 1}" for k in range(MAX_SCALES)} <= params
    for opt in (o for o in DECLARED.values() if o.on(UI) and not o.is_list):
        props = components[opt.name.replace("_", "-")]["props"]
        assert props["label"] == opt.label and props["info"] and opt.help.startswith(props["info"]), opt.name
        start = next(v for v in (opt.start, opt.default, opt.fallback) if v is not None)
        assert props["value"] == start, opt.name
        if opt.choices:
            assert {c[0] for c in props["choices"]} == set(opt.choices), opt.name
        elif opt.number is not None:
            assert props["minimum"] == opt.ge, opt.name
            assert props["maximum"] == (opt.form_le if opt.ui_le is None else opt.ui_le), opt.name


def test_the_cli_flags_have_the_declared_defaults_and_choices():
    flags = cli_flags()
    for opt in (o for o in DECLARED.values() if o.on(CLI)):
        action = flags[opt.name]
        assert action.dest == opt.name and action.help.startswith(opt.help), opt.name
        expected = {"seed": opt.start, "format": None}.get(opt.name, opt.default)  # the CLI's own: see CLI_SPECIFIC
        assert action.default == expected, opt.name
        if opt.choices:
            assert tuple(action.choices) == opt.choices, opt.name
    parser = stylize_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["c", "s", "-o", "o.png", "--guidance", str(DECLARED["guidance"].le + 1)])
    assert parser.parse_args(["c", "s", "-o", "o.png", "--guidance", str(DECLARED["guidance"].le)]).guidance == 10.0


def test_sampling_defaults_are_generation_configs():
    generation = {f.name for f in dataclasses.fields(GenerationConfig)}
    for name in generation & set(DECLARED):
        opt = DECLARED[name]
        value = opt.default if opt.default is not None else opt.fallback
        assert value == getattr(DEFAULT_GENERATION, name) or (value, name) == (None, "seed"), name
    assert (DECLARED["top_k"].fallback, DECLARED["top_p"].fallback) == (DEFAULT_GENERATION.top_k,
                                                                       DEFAULT_GENERATION.top_p)


@pytest.mark.parametrize("name, text", [("style_weights", "1e39,1"), ("style_weights", "1e-320,0"),
                                        ("style_weights", "1,1,1,1,1"), ("alphas", "0.5,1.5")])
def test_the_service_refuses_what_the_declaration_refuses(name, text):
    values = tuple(float(v) for v in text.split(","))
    with pytest.raises(RequestError, match=name):
        StylizeRequest.of(**{name: values})
    with pytest.raises(RequestValidationError) as refused:
        StylizeForm(**{name: text}).request()
    assert refused.value.errors()[0]["loc"][:2] == ("body", name)


@pytest.mark.slow
def test_the_pipeline_takes_every_declared_option_but_the_encoding():
    from stylevar.pipelines.pipeline import StylePipeline

    pipe = StylePipeline.random(micro_configs(), seed=0)
    content, style = Image.new("RGB", (24, 16), (200, 40, 40)), Image.new("RGB", (16, 16), (20, 40, 220))
    n_scales = len(pipe.config.transformer.patch_nums)
    values = {k: v for k, v in every_option_set().model_dump().items() if DECLARED[k].on(PYTHON)}
    values.update(alphas=(0.5,) * n_scales, style_weights=(0.5, 0.5))
    assert set(values) == set(DECLARED) - {"format"}
    images = pipe(content, [style, style], **values)
    assert len(images) == 2 and all(np.asarray(im).shape == (16, 24, 3) for im in images)
    with pytest.raises(TypeError, match="format"):
        pipe(content, style, format="png")


@pytest.mark.slow
def test_the_declaration_is_light():
    import subprocess
    import sys

    code = "import sys, stylevar.pipelines.options, stylevar.pipelines.request; print(json.dumps(sorted(m for m in sys.modules if m.startswith('torch'))))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout) == [], out.stderr
