"""LoRA adapters: zero start, disabled == base, merged == enabled, snapshots, unload, checkpoint baking,
`stylevar merge-lora`."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from stylevar.loaders.convert import bake_lora
from stylevar.cli import main as cli_main
from stylevar.models.lora import (DEFAULT_TARGETS, LoRAConfig, LoRAError, LoRALinear, attach_lora, load_lora_state_dict,
                           lora_disabled, lora_modules, lora_parameters, lora_state_dict, merge_lora, snapshot_lora,
                           unload_lora)
from stylevar.pipelines.pipeline import StylePipeline
from tests.conftest import micro_configs


pytestmark = pytest.mark.usefixtures("one_thread")


def lively(model):
    """A random model whose blocks matter: a fresh init keeps every block near the identity (AdaLN gammas
    ~1e-3), which would hide what an adapter does."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for blk in model.blocks:
            lin = blk.ada_lin[1]
            lin.bias.copy_(torch.randn(lin.bias.shape, generator=g) * 0.5)
        model.head.weight.mul_(20)
    return model.eval()


@pytest.fixture()
def model():
    return lively(StylePipeline.random(micro_configs(), seed=0).model)


def _inputs(model, n: int = 2, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    s = model.tokenizer.cfg.image_size
    content = torch.rand(n, 3, s, s, generator=g) * 2 - 1
    style = torch.rand(n, 3, s, s, generator=g) * 2 - 1
    target = torch.rand(n, 3, s, s, generator=g) * 2 - 1
    with torch.no_grad():
        idx = model.tokenizer.encode_indices(target)
    return content, style, idx


def _logits(model, inputs):
    with torch.no_grad():
        return model.teacher_forcing_logits(*inputs)


def _randomise_lora(model, seed: int = 5, std: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lora_parameters(model):
            p.copy_(torch.randn(p.shape, generator=g) * std)


def test_attach_wraps_the_named_linears_and_starts_at_the_base(model):
    inputs = _inputs(model)
    base = _logits(model, inputs)
    names = attach_lora(model, LoRAConfig(rank=4, alpha=8), seed=0)
    depth = len(model.blocks)
    assert names == [f"blocks.{i}.{t}" for i in range(depth) for t in DEFAULT_TARGETS]
    assert list(lora_modules(model)) == names
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.lora_{m}" for n in names for m in "AB"}
    m = lora_modules(model)["blocks.0.attn.kv_target"]
    C = model.cfg.embed_dim
    assert m.lora_A.shape == (4, C) and m.lora_B.shape == (2 * C, 4) and m.scaling == 2.0
    assert torch.count_nonzero(m.lora_B) == 0 and torch.count_nonzero(m.lora_A) > 0
    assert torch.equal(_logits(model, inputs), base)  # B = 0: the adapted model computes the base


def test_disabled_is_the_base_and_merged_is_the_enabled_model(model):
    inputs = _inputs(model)
    reference = copy.deepcopy(model)
    base = _logits(reference, inputs)
    attach_lora(model, LoRAConfig(rank=4, alpha=8), seed=0)
    _randomise_lora(model)
    enabled = _logits(model, inputs)
    assert (enabled - base).abs().max() > 1e-3  # the adapters do change the output (kv_target included)
    with lora_disabled(model):
        assert torch.equal(_logits(model, inputs), base)
    assert torch.equal(_logits(model, inputs), enabled)  # re-enabled on exit
    merge_lora(model)
    torch.testing.assert_close(_logits(model, inputs), enabled, atol=1e-5, rtol=0)
    for m in lora_modules(model).values():
        assert torch.count_nonzero(m.lora_B) == 0
    # after a merge the reference policy is the merged model
    with lora_disabled(model):
        torch.testing.assert_close(_logits(model, inputs), enabled, atol=1e-5, rtol=0)


def test_each_target_is_used(model):
    """Perturbing the adapter of any single target changes the logits."""
    inputs = _inputs(model)
    attach_lora(model, LoRAConfig(rank=2, alpha=2), seed=0)
    base = _logits(model, inputs)
    for target in DEFAULT_TARGETS:
        m = lora_modules(model)[f"blocks.0.{target}"]
        with torch.no_grad():
            m.lora_B.fill_(0.05)
        assert (_logits(model, inputs) - base).abs().max() > 1e-4, target
        with torch.no_grad():
            m.lora_B.zero_()


def test_weight_property_and_forward_agree():
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5)
    m = LoRALinear(lin, rank=3, scaling=0.5)
    with torch.no_grad():
        m.lora_B.normal_()
    x = torch.randn(4, 6)
    torch.testing.assert_close(m(x), torch.nn.functional.linear(x, m.weight, m.bias))
    plain = m.to_linear()
    torch.testing.assert_close(plain(x), m(x), atol=1e-6, rtol=0)
    m.enabled = False
    assert torch.equal(m(x), lin(x))


def test_snapshot_restore_and_state_dict(model):
    inputs = _inputs(model)
    attach_lora(model, LoRAConfig(rank=4, alpha=4), seed=0)
    _randomise_lora(model, seed=1)
    snap = snapshot_lora(model)
    first = _logits(model, inputs)
    _randomise_lora(model, seed=2)
    assert not torch.equal(_logits(model, inputs), first)
    load_lora_state_dict(model, snap)
    assert torch.equal(_logits(model, inputs), first)
    sd = lora_state_dict(model)
    assert set(sd) == set(snap) and all(k.endswith((".lora_A", ".lora_B")) for k in sd)
    with pytest.raises(LoRAError, match="does not fit"):
        load_lora_state_dict(model, {k: v for k, v in snap.items() if "blocks.0" not in k})


def test_unload_gives_plain_linears_and_a_loadable_model_dir(model, tmp_path):
    inputs = _inputs(model)
    attach_lora(model, LoRAConfig(rank=4, alpha=8), seed=0)
    _randomise_lora(model)
    enabled = _logits(model, inputs)
    unload_lora(model)
    assert not lora_modules(model)
    assert type(model.blocks[0].attn.kv_target) is torch.nn.Linear
    torch.testing.assert_close(_logits(model, inputs), enabled, atol=1e-5, rtol=0)
    StylePipeline.from_models(model, name="merged").save_pretrained(tmp_path / "m")
    again = StylePipeline.from_pretrained(tmp_path / "m", device="cpu").model
    torch.testing.assert_close(_logits(again, inputs), enabled, atol=1e-5, rtol=0)


def test_checkpoint_layout_bakes_like_merge(model):
    """state_dict of an adapted model = the published GRPO layout; checkpoints.bake_lora gives the merge."""
    inputs = _inputs(model)
    attach_lora(model, LoRAConfig(rank=4, alpha=8), seed=0)
    _randomise_lora(model)
    sd = model.transformer_state_dict()
    assert "blocks.1.ffn.fc1.base_weight" in sd and "blocks.1.ffn.fc1.lora_A" in sd and "blocks.1.ffn.fc1.bias" in sd
    baked = bake_lora(sd, {"lora_rank": 4, "lora_alpha": 8})
    enabled = _logits(model, inputs)
    unload_lora(model)
    plain = model.transformer_state_dict()
    assert baked.keys() == plain.keys()
    for k in plain:
        torch.testing.assert_close(baked[k], plain[k], atol=1e-6, rtol=0, msg=k)
    torch.testing.assert_close(_logits(model, inputs), enabled, atol=1e-5, rtol=0)


def test_bad_requests_are_refused(model):
    with pytest.raises(LoRAError, match="rank"):
        LoRAConfig(rank=0)
    with pytest.raises(LoRAError, match="no module"):
        attach_lora(model, LoRAConfig(rank=2, targets=("attn.nope",)))
    with pytest.raises(LoRAError, match="nn.Linear"):
        attach_lora(model, LoRAConfig(rank=2, targets=("attn",)))
    with pytest.raises(LoRAError, match="no LoRA adapters"):
        lora_parameters(model)
    attach_lora(model, LoRAConfig(rank=2))
    with pytest.raises(LoRAError, match="already"):
        attach_lora(model, LoRAConfig(rank=2))


def test_merge_lora_command(model, tmp_path, capsys):
    """`stylevar merge-lora` on a checkpoint in the GRPO layout (TrainingState.state_dict + args + pipeline config)."""
    pipe = StylePipeline.from_models(model, name="base")
    base_dir = pipe.save_pretrained(tmp_path / "base")
    inputs = _inputs(model)
    attach_lora(model, LoRAConfig(rank=4, alpha=8), seed=0)
    _randomise_lora(model)
    enabled = _logits(model, inputs)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    state = {"step": 7, "model": model.state_dict(), "extra": {"pipeline_config": pipe.config.to_dict()},
             "args": {"lora_rank": 4, "lora_alpha": 8}}
    torch.save(state, run / "checkpoints" / "step-00000007.pt")
    torch.save({**state, "step": 3}, run / "checkpoints" / "step-00000003.pt")
    assert cli_main(["merge-lora", str(run), "--out", str(tmp_path / "out")]) == 0
    assert "step-00000007.pt" in capsys.readouterr().out
    merged = StylePipeline.from_pretrained(tmp_path / "out", device="cpu")
    assert merged.config.name == "stylevar-grpo" and merged.config.extra["step"] == 7
    torch.testing.assert_close(_logits(merged.model, inputs), enabled, atol=1e-5, rtol=0)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["format"] == "stylevar"

    # a checkpoint without config needs --config; a non-LoRA one is refused; errors exit with code 2
    bare = tmp_path / "bare.pt"
    torch.save({"model": model.state_dict(), "args": {"lora_rank": 4, "lora_alpha": 8}}, bare)
    assert cli_main(["merge-lora", str(bare), "--out", str(tmp_path / "o2")]) == 2
    assert "--config" in capsys.readouterr().err
    assert cli_main(["merge-lora", str(bare), "--config", str(base_dir), "--out", str(tmp_path / "o2")]) == 0
    torch.testing.assert_close(_logits(StylePipeline.from_pretrained(tmp_path / "o2", device="cpu").model, inputs),
                               enabled, atol=1e-5, rtol=0)
    plain = tmp_path / "plain.pt"
    torch.save({"model": StylePipeline.random(micro_configs(), seed=1).model.state_dict(),
                "extra": {"pipeline_config": pipe.config.to_dict()}}, plain)
    assert cli_main(["merge-lora", str(plain), "--out", str(tmp_path / "o3")]) == 2
    assert "no LoRA weights" in capsys.readouterr().err
    assert cli_main(["merge-lora", str(tmp_path / "missing"), "--out", str(tmp_path / "o4")]) == 2
