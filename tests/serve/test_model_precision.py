"""What the service says of its precision: auto by default (settled when the model loads, `choose_precision`), fp32
when asked for; `/v1/model` gives the precision and why, as the "model loaded" record does, the ready line names it,
and the OpenAPI document declares both fields."""
from __future__ import annotations

import logging
import threading

import pytest
from fastapi.testclient import TestClient

from serve.__main__ import ready_line
from serve.http.app import create_app
from serve.settings import ServeSettings
from stylevar.runtime.inference import ASKED_REASON, NO_NATIVE_REASON


def test_the_default_is_auto(monkeypatch, tiny_model_dir):
    monkeypatch.delenv("STYLEVAR_PRECISION", raising=False)  # the suite pins fp32 (tests/conftest.py)
    assert ServeSettings.model_fields["precision"].default == "auto"
    assert ServeSettings(model_dir=tiny_model_dir).precision == "auto"
    monkeypatch.setenv("STYLEVAR_PRECISION", "fp32")
    assert ServeSettings(model_dir=tiny_model_dir).precision == "fp32"


@pytest.mark.parametrize("precision", ["auto", "fp32"])
def test_model_info_says_the_precision_and_why(tiny_model_dir, precision, caplog):
    app, ready = create_app(ServeSettings(model_dir=tiny_model_dir, device=["cpu"], ui=False, warmup=False,
                                          precision=precision)), threading.Event()
    app.state.service.on_ready = ready.set
    with caplog.at_level(logging.INFO, logger="serve.engine.runner"), TestClient(app) as http:
        assert ready.wait(60)
        info = http.get("/v1/model").json()
        line = ready_line(app, app.state.service.settings)
    [loaded] = [r for r in caplog.records if r.getMessage() == "model loaded"]
    assert (info["precision"], info["precision_reason"]) == (loaded.precision, loaded.precision_reason)
    assert line.startswith(f"StyleVAR ready (tiny-test, {info['precision']}): ")
    if precision == "fp32":
        assert (info["precision"], info["precision_reason"]) == ("fp32", ASKED_REASON)
    else:
        assert info["precision"] in ("fp32", "bf16")
        assert info["precision_reason"] == NO_NATIVE_REASON or "measured at load" in info["precision_reason"]


def test_the_document_declares_the_precision(tiny_model_dir):
    spec = create_app(ServeSettings(model_dir=tiny_model_dir, device=["cpu"], ui=False, warmup=False)).openapi()
    schema = spec["components"]["schemas"]["ModelInfo"]
    assert {"precision", "precision_reason"} <= set(schema["required"])
    assert schema["properties"]["precision"]["enum"] == ["fp32", "bf16"]
    assert schema["properties"]["precision_reason"]["type"] == "string"
