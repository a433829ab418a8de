"""benchmarks/roofline.py on the tiny preset (64 px, one timed round): the peaks, a row per stage and scale for
every model, FLOPs that are positive and add up to the whole call's, and the same figures in the JSON."""
from __future__ import annotations

import json

import pytest

from benchmarks import roofline

pytestmark = pytest.mark.slow  # three tiny models timed and counted: about a minute on two busy cores


def test_tiny_run_reports_every_stage_with_consistent_flops(tmp_path, capsys):
    out = tmp_path / "roofline.json"
    assert roofline.main(["--preset", "tiny", "--batch-sizes", "1", "--precisions", "fp32", "bf16",
                          "--repeats", "1", "--warmup", "0", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert set(result["peak_gflops"]) == {"fp32", "bf16"}
    assert all(set(k) == set(roofline.PEAK_KERNELS) and min(k.values()) > 0 for k in result["peak_gflops"].values())
    models = result["batches"]["1"]
    assert set(models) == {"fp32", "bf16", roofline.ALT}
    assert set(result["bf16_parts"][roofline.ALT]) ^ set(result["bf16_parts"]["bf16"]) == {"tokenizer_decoder"}
    assert models["bf16"]["decode"]["dtype"] != models[roofline.ALT]["decode"]["dtype"]
    scales = [f"loop {k}" for k in range(6)]  # the tiny preset's six scales
    for stages in models.values():
        assert set(stages) == {*roofline.STAGE_PARTS, *scales, "total"}
        assert all(s["gflop"] > 0 and s["ms"] > 0 and s["fraction_of_peak"] > 0 for s in stages.values())
        parts = sum(stages[s]["gflop"] for s in roofline.STAGE_PARTS)
        assert parts == pytest.approx(stages["total"]["gflop"], rel=0.02)  # the rest: condition embeddings
        assert sum(stages[s]["gflop"] for s in scales) == pytest.approx(stages["loop"]["gflop"], rel=1e-6)
        assert stages["encode_content"]["dtype"] == "fp32"
    assert models["bf16"]["loop 0"]["dtype"] == "bf16" and models["fp32"]["loop 0"]["dtype"] == "fp32"
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| peak GFLOP/s") and len(rows) == 3 + 1 + len(models["fp32"])
    assert all(line.count("|") == rows[3].count("|") for line in rows[3:])


def test_the_int8_lever_quantizes_every_loop_linear_and_agreement_is_per_scale():
    import copy

    import torch

    from stylevar.config import presets
    from stylevar.pipelines.pipeline import StylePipeline
    from stylevar.runtime.inference import InferenceConfig, prepare

    plain = StylePipeline.random(presets("tiny"), seed=0).model.eval()
    fp32 = prepare(copy.deepcopy(plain), InferenceConfig(precision="fp32"))
    int8 = roofline.int8_weights(prepare(copy.deepcopy(plain), InferenceConfig(precision="fp32", pack_linears=False)))
    fc1 = int8.blocks[0].ffn.fc1
    assert fc1.w_OI.dtype == torch.int8 and int8.head.w_OI.dtype == torch.int8
    x = torch.randn(2, 5, fc1.w_OI.shape[1])
    want = plain.blocks[0].ffn.fc1(x)
    with torch.no_grad():
        assert (fc1(x) - want).abs().max() <= 0.02 * want.abs().max()  # int8 weights, bf16 activations
    size, scales = plain.tokenizer.cfg.image_size, len(plain.cfg.patch_nums)
    agreement = roofline.token_agreement({"fp32": fp32, "same": prepare(copy.deepcopy(plain), InferenceConfig(precision="fp32")),
                                          "int8 weights": int8}, size, 1)
    assert agreement["same"] == [1.0] * scales  # a copy samples what fp32 samples, scale by scale
    assert len(agreement["int8 weights"]) == scales and all(0 <= a <= 1 for a in agreement["int8 weights"])
    assert "fp32" not in agreement


def test_levers_build_every_row_and_max_autotune_wraps_each_blocks_step():
    _, models, rows = roofline.build_models("tiny", ["fp32"], levers=True)
    assert set(models) == set(rows) == {"fp32", *roofline.LEVERS}
    tuned = models["fp32 max-autotune"]
    for block in tuned.blocks:  # compiled lazily: the autotuning happens at the first call, in the benchmark
        original = block.step._torchdynamo_orig_callable
        assert original.__self__ is block and original.__func__ is type(block).step
    assert roofline.AUTOTUNE["max_autotune"] and roofline.AUTOTUNE["freezing"]


def test_a_model_directory_is_timed_with_its_own_shapes_and_weights(micro_model_dir, tmp_path, capsys):
    from stylevar.pipelines.pipeline import StylePipeline

    out = tmp_path / "roofline.json"
    assert roofline.main(["--model", str(micro_model_dir), "--batch-sizes", "1", "--precisions", "fp32", "--repeats",
                          "1", "--warmup", "0", "--agreement-seeds", "0", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert (result["model"], result["preset"]) == (str(micro_model_dir), None)
    assert capsys.readouterr().out.startswith(f"model {micro_model_dir}, {result['image_size']} px")
    model = StylePipeline.from_pretrained(micro_model_dir, device="cpu").model
    assert result["image_size"] == model.tokenizer.cfg.image_size
    stages = result["batches"]["1"]["fp32"]
    assert {s for s in stages if s.startswith("loop ")} == {f"loop {k}" for k in range(len(model.cfg.patch_nums))}
