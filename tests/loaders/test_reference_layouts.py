"""The in-repo conformance data and its seeded weights; the published d20 layouts through the real loaders."""
from __future__ import annotations

import contextlib
import gc
import hashlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from stylevar.loaders.convert import load_stylevar, load_vqvae
from stylevar.config import StyleVARConfig, VQVAEConfig
from tests import reference
from training.sft.var_init import init_from_var

# sha256 over (name, raw bytes) of every entry of the golden_small states, as the reference's own builder
# made them (tests/data/reference/README.md): the golden outputs hold only to these exact tensors
GOLDEN_STATE_SHA256 = {
    ("vae_keys.tsv", 0): "d66d5b9403db33b9cddff2a322c3bd2ff43a8066bd437874d8903726b966ea2f",
    ("stylevar_keys.tsv", 1000): "faf51a35f6d805d564dffc0f38f8fc950d9f3782f74ebea0816a06ea0a81191e",
    ("var_keys.tsv", 2000): "ca065d8d89152f29fe2eab535dedd5128e32afbc65f805e7166fa15604c783bf",
}


def _digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name, value in state.items():
        h.update(name.encode())
        h.update(value.contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("table, offset", list(GOLDEN_STATE_SHA256))
def test_seeded_states_are_bit_identical_to_the_reference(reference_dir, table, offset):
    cfg = reference.read_config(reference_dir)
    entries = reference.read_key_table(reference_dir / "golden_small" / table)
    state = reference.seeded_state(entries, cfg["patch_nums"], cfg["seed"] + offset)
    assert [e.name for e in entries] == list(state)
    assert _digest(state) == GOLDEN_STATE_SHA256[table, offset]


def test_derived_entries_and_table_errors(tmp_path):
    table = tmp_path / "keys.tsv"
    table.write_text("lvl_1L\t(1, 5)\tint64\nattn_bias_for_masking\t(1, 1, 5, 5)\tfloat32\n"
                     "b.num_batches_tracked\t()\tint64\nw.weight\t(3, 2, 2)\tfloat32\n")
    state = reference.seeded_state(reference.read_key_table(table), (1, 2), seed=0)
    assert state["lvl_1L"].tolist() == [[0, 1, 1, 1, 1]]
    bias = state["attn_bias_for_masking"][0, 0]
    assert bias[0].tolist() == [0.0] + [-float("inf")] * 4  # the first scale sees only itself
    assert (bias[1:] == 0).all()  # the second sees both
    assert state["b.num_batches_tracked"].dtype == torch.int64 and state["b.num_batches_tracked"].ndim == 0
    torch.testing.assert_close(state["w.weight"].std(), torch.tensor(0.5), atol=0.3, rtol=0)  # 1 / sqrt(2 * 2)
    table.write_text("w.weight\t(3, 2)\tfloat16\n")
    with pytest.raises(ValueError, match="w.weight: the table says float16"):
        reference.seeded_state(reference.read_key_table(table), (1,), seed=0)
    table.write_text("w.weight (3, 2) float32\n")
    with pytest.raises(ValueError, match="keys.tsv:1: expected"):
        reference.read_key_table(table)


def test_missing_data_is_an_error_naming_the_files(tmp_path, monkeypatch):
    (tmp_path / "golden_small").mkdir()
    (tmp_path / "golden_small" / "config.json").write_text("{}")
    monkeypatch.setenv(reference.ENV_VAR, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing golden_small/golden.pt, .*official/stylevar_d20_keys.tsv"):
        reference.reference_dir()
    monkeypatch.delenv(reference.ENV_VAR)
    assert reference.reference_dir() == reference.DATA_DIR


# ---- the published d20 layouts -------------------------------------------------------------------------
def _stylevar_parameters(table: list[reference.Entry], dim: int) -> int:
    """Parameters StyleVAR keeps from a reference-layout table: of each block's two (3C, C) projections
    only the guide's Q rows and the target's K, V rows; the target's Q bias and the guide's V bias feed the
    rows that are dropped."""
    kept = {"mat_qkv_guide.weight": dim * dim, "mat_qkv_target.weight": 2 * dim * dim,
            "q_bias_target": 0, "v_bias_guide": 0}
    total = 0
    for e in table:
        if e.leaf in reference.BUFFER_LEAVES:
            continue
        leaf2 = ".".join(e.name.split(".")[-2:])
        total += kept.get(leaf2, kept.get(e.leaf, e.numel))
    return total


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _status_kib(field: str) -> int:
    row = next(r for r in Path("/proc/self/status").read_text().splitlines() if r.startswith(field + ":"))
    return int(row.split()[1])


@contextlib.contextmanager
def peak_memory_growth_below(gib: float) -> Iterator[None]:
    """Fail when this process's peak resident memory rises by `gib` GiB or more inside the block. Linux
    only (the peak is reset through /proc/self/clear_refs); elsewhere nothing is measured."""
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")
        start = _status_kib("VmRSS")
    except (OSError, StopIteration):
        start = None
    yield
    if start is not None:
        growth = (_status_kib("VmHWM") - start) / 2**20
        assert growth < gib, f"peak memory rose by {growth:.2f} GiB, the budget is {gib} GiB"


D20_MEMORY_GIB = 6.0  # a d20 state dict (2.9 GB) and the transformer it loads into (2.5 GB) live together once


@pytest.fixture(scope="module")
def d20(reference_dir):
    """The d20 preset, the official key tables and the tokenizer loaded from its seeded stand-in weights."""
    official = reference_dir / "official"
    vq_cfg, tr_cfg = VQVAEConfig.preset("d20"), StyleVARConfig.preset("d20")
    vae_table = reference.read_key_table(official / "vae_ch160v4096z32_keys.tsv")
    sd = reference.seeded_state(vae_table, tr_cfg.patch_nums, seed=0)
    vq = load_vqvae(sd, vq_cfg)
    return SimpleNamespace(
        vq=vq, vq_cfg=vq_cfg, tr_cfg=tr_cfg, vae_table=vae_table, codebook=sd["quantize.embedding.weight"],
        stylevar_table=reference.read_key_table(official / "stylevar_d20_keys.tsv"),
        var_table=reference.read_key_table(official / "var_d20_keys.tsv"))


@pytest.mark.slow
def test_published_d20_stylevar_loads_and_runs(d20):
    """Stand-in weights in the published vae_ch160v4096z32 and StyleVAR d20 layouts load through the real
    loaders with the d20 preset, with the parameter counts the tables imply, and give finite logits."""
    assert _count(d20.vq) == reference.parameter_count(d20.vae_table)
    assert torch.equal(d20.vq.quantize.embedding.weight, d20.codebook)
    C = d20.tr_cfg.embed_dim
    expected = _stylevar_parameters(d20.stylevar_table, C) + _count(d20.vq)
    with peak_memory_growth_below(D20_MEMORY_GIB):
        sd = reference.seeded_state(d20.stylevar_table, d20.tr_cfg.patch_nums, seed=1)
        model = load_stylevar(sd, d20.tr_cfg, d20.vq)
        last = model.blocks[-1].attn
        assert torch.equal(last.q_guide.weight, sd["blocks.19.attn.mat_qkv_guide.weight"][:C])
        assert torch.equal(last.kv_target.weight, sd["blocks.19.attn.mat_qkv_target.weight"][C:])
        assert torch.equal(last.v_bias, sd["blocks.19.attn.v_bias_target"])
        assert torch.equal(model.content_encoder[1].running_var, sd["content_encoder.1.running_var"])
        del sd
        gc.collect()
        assert _count(model) == expected and round(expected / 1e6, 1) == 731.6

        gen = torch.Generator().manual_seed(0)
        content, style = (torch.rand(1, 3, 256, 256, generator=gen) * 2 - 1 for _ in range(2))
        target = [torch.randint(0, d20.vq_cfg.vocab_size, (1, p * p), generator=gen) for p in d20.tr_cfg.patch_nums]
        with torch.no_grad():
            logits = model.teacher_forcing_logits(content, style, target)
        assert logits.shape == (1, 680, 4096) and logits.dtype == torch.float32
        assert logits.isfinite().all() and logits.std() > 0


@pytest.mark.slow
def test_published_var_d20_initialises_stylevar_d20(d20, weight_homes):
    """Stand-in weights in the published VAR-d20 layout initialise StyleVAR d20 through init_from_var:
    every VAR parameter but the class embedding is carried over, the rest starts fresh."""
    C, table = d20.tr_cfg.embed_dim, d20.var_table
    with peak_memory_growth_below(D20_MEMORY_GIB):
        sd = reference.seeded_state(table, d20.tr_cfg.patch_nums, seed=2)
        model, summary = init_from_var(sd, d20.tr_cfg, d20.vq)
        assert _count(model) == _stylevar_parameters(d20.stylevar_table, C) + _count(d20.vq)
        assert summary["encoders"] == "random"  # the weight cache is empty: no ImageNet trunks
        dropped = [k for k in summary["dropped"] if k.rpartition(".")[2] not in reference.BUFFER_LEAVES]
        assert dropped == ["class_emb.weight"]
        sizes = {e.name: e.numel for e in table}
        carried = sum(sizes[k] for k in [*summary["copied"], *summary["split"]])
        assert carried == reference.parameter_count(table) - sizes["class_emb.weight"]
        assert len(summary["split"]) == 3 * d20.tr_cfg.depth
        qkv = sd["blocks.19.attn.mat_qkv.weight"]
        assert torch.equal(model.blocks[-1].attn.q_guide.weight, qkv[:C])
        assert torch.equal(model.blocks[-1].attn.kv_target.weight, qkv[C:])
        assert torch.equal(model.head.weight, sd["head.weight"])
        assert {"feat_emb.weight", "style_encoder.0.weight", "content_encoder.0.weight"} <= set(summary["fresh"])
