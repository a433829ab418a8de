"""Precision "auto" (stylevar.runtime.inference): `decide` chooses bf16 only where it is native and measured faster by
the margin, the measurement times both precisions on this CPU without touching torch's random state, off the CPU
auto is fp32 and the model stays as it was, and "auto" is settled before `prepare` runs anything."""
from __future__ import annotations

import pytest
import torch

import stylevar.runtime.inference as inference
from stylevar.runtime.inference import (AUTO_MARGIN, GPU_REASON, NO_NATIVE_REASON, InferenceConfig, PrecisionChoice,
                                        choose_precision, decide, packing_available, precision_of, prepare,
                                        prepare_for_serving, prepared, time_products)
from stylevar.pipelines.pipeline import StylePipeline
from tests.conftest import micro_configs

MEASURED = "measured at load"


@pytest.mark.parametrize(("native", "fp32_s", "bf16_s", "precision", "said"), [
    (False, None, None, "fp32", NO_NATIVE_REASON),
    (False, 2.0, 1.0, "fp32", NO_NATIVE_REASON),  # emulated bf16 is never chosen, whatever a timing says
    (True, None, None, "fp32", "could not be measured"),
    (True, 1.9, 1.0, "bf16", "bf16 products run at 1.90x fp32's speed on this CPU, measured at load"),
    (True, AUTO_MARGIN, 1.0, "bf16", "1.15x"),  # the margin itself is enough
    (True, 1.1, 1.0, "fp32", "bf16 products run at 1.10x fp32's speed on this CPU, measured at load; bf16 needs 1.15x"),
    (True, 169.0, 302.0, "fp32", "0.56x"),  # bf16 slower: the AVX512-BF16 CPU without AMX
])
def test_decide(native, fp32_s, bf16_s, precision, said):
    choice = decide(native, fp32_s, bf16_s)
    assert choice.precision == precision and said in choice.reason
    assert choice.measured == ({} if fp32_s is None or not native else {"fp32": fp32_s, "bf16": bf16_s})


def test_a_margin_of_its_own():
    assert decide(True, 1.9, 1.0, margin=2.0).precision == "fp32"
    assert decide(True, 1.9, 1.0, margin=1.5).precision == "bf16"


def test_off_the_cpu_auto_is_fp32_without_measuring(monkeypatch):
    monkeypatch.setattr(inference, "time_products", lambda *a, **k: pytest.fail("measured off the CPU"))
    for device in ("cuda", torch.device("cuda:1"), "mps"):
        assert choose_precision(64, device) == PrecisionChoice("fp32", GPU_REASON)


def test_a_cpu_without_native_bf16_is_fp32_without_measuring(monkeypatch):
    monkeypatch.setattr(inference, "native_cpu_bf16", lambda: False)
    monkeypatch.setattr(inference, "time_products", lambda *a, **k: pytest.fail("measured without native bf16"))
    assert choose_precision(64, "cpu") == PrecisionChoice("fp32", NO_NATIVE_REASON)


@pytest.mark.skipif(not packing_available(torch.bfloat16), reason="this torch or CPU has no packed bf16 products")
def test_the_measurement_times_both_precisions_here_and_leaves_the_random_state():
    before = torch.get_rng_state()
    seconds = time_products(64, 256, repeats=2, warmup=1)
    assert set(seconds) == {"fp32", "bf16"} and all(0 < s < float("inf") for s in seconds.values())
    assert torch.equal(torch.get_rng_state(), before)


def test_auto_on_this_cpu_is_a_valid_choice_with_its_reason():
    model = StylePipeline.random(micro_configs(), seed=1).model
    choice = choose_precision(model)
    assert choice.precision in ("fp32", "bf16")
    if inference.native_cpu_bf16() and packing_available(torch.bfloat16):
        assert MEASURED in choice.reason and all(s > 0 for s in choice.measured.values())
        assert choice.precision == decide(True, choice.measured["fp32"], choice.measured["bf16"]).precision
    else:
        assert choice.precision == "fp32" and not choice.measured


@pytest.mark.parametrize("settled", ["fp32", "bf16"])
@pytest.mark.parametrize("entry", [prepare, prepare_for_serving])
def test_auto_is_settled_before_prepare_and_kept_on_the_model(monkeypatch, settled, entry):
    monkeypatch.setattr(inference, "choose_precision", lambda model: PrecisionChoice(settled, "as the test says"))
    seen = []
    monkeypatch.setattr(inference, "run_bf16", lambda model, parts: seen.append(prepared(model)))
    model = StylePipeline.random(micro_configs(), seed=1).model
    entry(model, InferenceConfig(precision="auto"))
    assert prepared(model) == InferenceConfig(precision=settled)
    assert precision_of(model) == PrecisionChoice(settled, "as the test says")
    assert len(seen) == (settled == "bf16")  # bf16's parts were set, after auto was settled


def test_off_the_cpu_auto_leaves_the_model_as_it_is():
    """The GPU path: fp32 under auto prepares nothing, as plain fp32 did (the meta device stands for a GPU)."""
    model = StylePipeline.random(micro_configs(), seed=1).model.to("meta")
    assert prepare_for_serving(model, InferenceConfig(precision="auto")) is False
    assert prepared(model) is None and precision_of(model) == PrecisionChoice("fp32", GPU_REASON)


def test_what_a_model_says_it_runs_in():
    plain = StylePipeline.random(micro_configs(), seed=1).model
    assert precision_of(plain).precision == "fp32"
    prepare_for_serving(plain, InferenceConfig(precision="fp32"))
    assert precision_of(plain) == PrecisionChoice("fp32", inference.ASKED_REASON)
    with pytest.raises(ValueError, match="already prepared"):  # what it runs in stays what it says
        prepare_for_serving(plain, InferenceConfig(precision="bf16"))
    assert precision_of(plain).precision == "fp32"
