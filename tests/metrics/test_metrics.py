"""Metrics through the real loading code, on stand-in weights written into a temporary cache."""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from stylevar import metrics
from stylevar.loaders import weights
from stylevar.metrics.definitions import NAMES
from stylevar.metrics.structure import gaussian_window, ssim, ssim_standard
from stylevar.metrics.vgg import CONTENT_LAYER, STYLE_LAYERS, VGGLosses, gram_matrix
from stylevar.models.state_dict import WeightMismatchError, read_state_dict
from tests.conftest import use_weight_cache

DINO_BACKBONE_URL = "https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/dino_vitbase16_pretrain.pth"


# ----------------------------------------------------------------------------------------------- stand-ins


def standin(ref: dict[str, torch.Tensor], seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Random tensors with the keys and shapes of `ref` (meta tensors allowed).

    Weights ~ N(0, 2 / fan_in), biases ~ N(0, 0.02^2), 1-D weights (norms) ~ 1 + N(0, 0.1^2); scalars keep
    their value. Large tensors tile a block of 2^20 random values, to keep writing them fast.
    """
    g = torch.Generator().manual_seed(seed)

    def noise(shape: tuple[int, ...], scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
        n = math.prod(shape)
        block = (torch.randn(min(n, 1 << 20), generator=g) * scale + offset).to(dtype)
        return block.repeat(math.ceil(n / block.numel()))[:n].view(shape)

    out = {}
    for k, v in ref.items():
        shape = tuple(v.shape)
        if not v.is_floating_point():
            out[k] = torch.zeros(shape, dtype=v.dtype) if v.device.type == "meta" else v.clone()
        elif v.numel() == 1:
            out[k] = (torch.ones(shape) if v.device.type == "meta" else v.detach().clone().float()).to(dtype)
        elif k.endswith("bias"):
            out[k] = noise(shape, 0.02)
        elif len(shape) == 1:
            out[k] = noise(shape, 0.1, 1.0) if k.endswith("weight") else noise(shape, 0.02)
        else:
            out[k] = noise(shape, math.sqrt(2.0 / math.prod(shape[1:])))
    return out


def write_torchvision(torch_home: Path, name: str, seed: int) -> Path:
    """A torchvision ImageNet file stand-in under $TORCH_HOME/hub/checkpoints/ with the real file name."""
    from torchvision import models

    ctor = {"vgg19": models.vgg19, "vgg16": models.vgg16, "alexnet": models.alexnet, "resnet18": models.resnet18}[name]
    with torch.device("meta"):
        ref = ctor().state_dict()
    path = torch_home / "hub" / "checkpoints" / weights.get(name).filename
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(standin(ref, seed, torch.float16), path)
    return path


HUBCONF = '''"""Test stand-in for the facebookresearch/dino hub repo: same entry point and checkpoint URL."""
import torch

import vision_transformer as vits

dependencies = ["torch"]


def dino_vitb16(pretrained=True, **kwargs):
    model = vits.vit_base(patch_size=16, num_classes=0, **kwargs)
    if pretrained:
        sd = torch.hub.load_state_dict_from_url(url="{url}", map_location="cpu")
        model.load_state_dict(sd, strict=True)
    return model
'''


def write_dreamsim_tree(folder: Path, seed: int) -> Path:
    """The offline dreamsim dino_vitb16 cache: hub repo, DINO backbone, DINO head file, LoRA adapter."""
    import warnings

    from dreamsim.config import dreamsim_args
    from dreamsim.feature_extraction.vision_transformer import DINOHead, vit_base
    from dreamsim.model import PerceptualModel
    from peft import LoraConfig, get_peft_model

    repo = folder / "facebookresearch_dino_main"
    repo.mkdir(parents=True)
    (repo / "hubconf.py").write_text(HUBCONF.format(url=DINO_BACKBONE_URL))
    (repo / "vision_transformer.py").write_text(
        '"""Stand-in: DINO\'s ViT definition, as shipped inside dreamsim."""\n'
        "from dreamsim.feature_extraction.vision_transformer import *  # noqa: F401,F403\n"
    )
    (folder / "checkpoints").mkdir()
    vit = vit_base(patch_size=16, num_classes=0)
    torch.save(standin(vit.state_dict(), seed, torch.float16), folder / "checkpoints" / "dino_vitbase16_pretrain.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        head = DINOHead(768, 2048)
    head_sd = {k: v for k, v in head.state_dict().items() if k.startswith("mlp.")}
    head_sd["last_layer.weight"] = torch.empty(2048, 256)
    student = {f"module.head.{k}": v for k, v in standin(head_sd, seed + 1).items()}
    torch.save({"student": student}, folder / "dino_vitb16_pretrain.pth")
    # the LoRA adapter, written by peft itself from the model dreamsim builds
    saved_hub, before = torch.hub._hub_dir, set(sys.modules)
    torch.hub.set_dir(str(folder))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = PerceptualModel(**dreamsim_args["model_config"]["dino_vitb16"], device="cpu",
                                    load_dir=str(folder), normalize_embeds=True)
    finally:
        torch.hub._hub_dir = saved_hub
        for name in set(sys.modules) - before:
            if str(folder) in str(getattr(sys.modules[name], "__file__", "") or ""):
                del sys.modules[name]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=8, lora_dropout=0.0, bias="none", target_modules=["qkv"]))
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    peft_model.save_pretrained(str(folder / "dino_vitb16_single_lora"))
    return folder


def write_clip(home: Path, seed: int) -> Path:
    import open_clip
    from safetensors.torch import save_file

    with torch.device("meta"):
        model = open_clip.create_model("ViT-B-32", pretrained=None, force_quick_gelu=True, device="meta")
    path = home / weights.get("clip").filename
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(standin(model.state_dict(), seed, torch.float16), str(path))
    return path


SIZE = 64  # metric resolution in these tests (the default is the paper's 256; VGG at 256 px is slow on CPU)
FAST = ("style_loss", "content_loss", "lpips", "ssim", "ssim_standard")  # VGG / LPIPS / SSIM
SLOW = ("dreamsim", "clip")  # ViT-B/16 and ViT-B/32 stand-ins: writing, loading and running them takes > 20 s


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """STYLEVAR_HOME and TORCH_HOME point at an empty temporary cache for the module."""
    root = tmp_path_factory.mktemp("weights")
    with pytest.MonkeyPatch.context() as mp:
        use_weight_cache(mp, root)
        yield root


@pytest.fixture(scope="module")
def cache(env):
    """Stand-ins of the torchvision files: VGG-19, VGG-16, AlexNet."""
    for i, name in enumerate(("vgg19", "vgg16", "alexnet")):
        write_torchvision(env / "th", name, seed=10 + i)
    return env


@pytest.fixture(scope="module")
def full_cache(cache):
    """Plus the DreamSim tree and the CLIP file."""
    write_dreamsim_tree(cache / "sv" / "dreamsim", seed=20)
    write_clip(cache / "sv", seed=30)
    return cache


def run_rows(suite: metrics.MetricSuite) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Row 0: the fixed triplet; row 1: one image as generated, content and style (a batch of 2);
    then row 0 alone (a batch of 1: DreamSim squeezes single-image batches)."""
    gen, content, style = fixed_images()
    batch = (torch.cat([gen, content]), torch.cat([content, content]), torch.cat([style, content]))
    together = suite(*batch)
    alone = suite(*(x[:1] for x in batch))
    return together, alone


@pytest.fixture(scope="module")
def fast_results(cache):
    return run_rows(metrics.MetricSuite(FAST, batch_size=2, image_size=SIZE))


@pytest.fixture(scope="module")
def slow_results(full_cache):
    suite = metrics.MetricSuite(SLOW, batch_size=2, image_size=SIZE)
    return run_rows(suite)


def fixed_images(size: int = SIZE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three deterministic images (no RNG): generated, content, style, each (1, 3, size, size)."""
    yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    gen = torch.stack([xx, yy, 0.5 + 0.4 * torch.sin(2 * math.pi * 3 * xx)])
    content = torch.stack([xx * yy, 1 - yy, 0.5 + 0.4 * torch.cos(2 * math.pi * 2 * yy)])
    style = torch.stack([(xx * 8).floor() % 2, (yy * 8).floor() % 2, 0.5 * (xx + yy)])
    return gen[None], content[None], style[None]


# ----------------------------------------------------------------------------------------------- no weights


def test_gram_matrix_hand_computed():
    feat = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]], [[0.0, 1.0], [1.0, 0.0]]]])  # (1, 2, 2, 2)
    # rows [1,2,3,4] and [0,1,1,0]: dot products 30, 5, 2; divided by C*H*W = 8
    expected = torch.tensor([[[30.0, 5.0], [5.0, 2.0]]]) / 8
    assert torch.allclose(gram_matrix(feat), expected)


@pytest.mark.slow
def test_ssim_identical_is_one_and_constant_images_match_the_formula():
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(ssim(x, x), torch.ones(2), atol=1e-6)
    assert torch.allclose(ssim_standard(x, x), torch.ones(2), atol=1e-6)
    a, b = torch.full((1, 3, 32, 32), 0.2), torch.full((1, 3, 32, 32), 0.6)
    closed_form = (2 * 0.2 * 0.6 + 0.01**2) / (0.2**2 + 0.6**2 + 0.01**2)
    # valid-region SSIM of two constant images is the luminance term alone
    assert ssim_standard(a, b).item() == pytest.approx(closed_form, abs=2e-4)  # float32 variances
    # the paper's zero padding darkens the border windows, which changes the mean
    assert abs(ssim(a, b).item() - closed_form) > 1e-3


@pytest.mark.slow
def test_paper_ssim_matches_an_explicit_window_computation():
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(1, 3, 16, 16, generator=g), torch.rand(1, 3, 16, 16, generator=g)
    w = gaussian_window().double().reshape(-1)  # (121,)
    xp, yp = F.pad(x.double(), (5, 5, 5, 5)), F.pad(y.double(), (5, 5, 5, 5))  # zero padding
    px, py = F.unfold(xp, 11), F.unfold(yp, 11)  # (1, 3*121, 256)
    px, py = px.view(3, 121, 256), py.view(3, 121, 256)
    mx, my = (w[:, None] * px).sum(1), (w[:, None] * py).sum(1)
    vx = (w[:, None] * px * px).sum(1) - mx**2
    vy = (w[:, None] * py * py).sum(1) - my**2
    cxy = (w[:, None] * px * py).sum(1) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    expected = (((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))).mean()
    assert ssim(x, y).item() == pytest.approx(expected.item(), abs=1e-5)
    assert ssim_standard(x, y).item() != pytest.approx(expected.item(), abs=1e-3)


def test_missing_weights_raise_with_paths_and_fetch_command(weight_homes):
    _, th = weight_homes
    with pytest.raises(weights.MissingWeightError) as e:
        metrics.MetricSuite(["lpips"])
    msg = str(e.value)
    assert "vgg16-397923af.pth" in msg
    assert str(th / "hub" / "checkpoints" / "vgg16-397923af.pth") in msg
    assert "stylevar weights fetch vgg16" in msg
    suite = metrics.MetricSuite(["ssim", "lpips", "clip"], allow_missing=True)
    assert suite.metrics == ("ssim",) and set(suite.skipped) == {"lpips", "clip"}
    x = torch.rand(1, 3, 64, 64)
    assert set(suite(x, x, x)) == {"ssim"}


def test_bad_inputs_are_rejected():
    suite = metrics.MetricSuite(["ssim"])
    x = torch.rand(2, 3, 32, 32)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        suite(x * 3, x, x)
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        suite(x[:, :1], x, x)
    with pytest.raises(ValueError, match="batch size"):
        suite(x, x[:1], x[:1])
    with pytest.raises(ValueError, match="unknown metric"):
        metrics.MetricSuite(["fid"])


# ----------------------------------------------------------------------------------------------- stand-in weights


IDENTICAL = {  # metric: (value for identical images, tolerance)
    "style_loss": (0.0, 0.0),
    "content_loss": (0.0, 0.0),
    "lpips": (0.0, 1e-6),
    "ssim": (1.0, 1e-5),
    "ssim_standard": (1.0, 1e-5),
    "dreamsim": (0.0, 1e-5),
    "clip": (1.0, 1e-5),
}
# measured with the stand-in weights of this file (seeds 10..30) on `fixed_images()` at 64 px, torch 2.x CPU
PINNED = {
    "style_loss": 0.0046633328311145306,
    "content_loss": 1.0546281337738037,
    "lpips": 0.21054235100746155,
    "ssim": 0.24220716953277588,
    "ssim_standard": 0.18726058304309845,
    "dreamsim": 0.42223453521728516,
    "clip": 0.4767386317253113,
}


def check_results(results, names):
    together, alone = results
    assert list(together) == list(names)
    for name in names:
        value, tol = IDENTICAL[name]
        assert together[name][1].item() == pytest.approx(value, abs=tol), f"{name} on identical images"
        assert together[name][0].item() == pytest.approx(PINNED[name], rel=1e-3, abs=1e-6), f"{name} pinned"
        assert torch.allclose(together[name][:1], alone[name], rtol=1e-4, atol=1e-6), f"{name} batched vs alone"


@pytest.mark.slow
def test_vgg_lpips_ssim_identical_pinned_batched(fast_results):
    check_results(fast_results, FAST)


@pytest.mark.slow
def test_dreamsim_clip_identical_pinned_batched(slow_results):
    check_results(slow_results, SLOW)


def test_pairing_uses_target_when_given():
    suite = metrics.MetricSuite(["ssim", "ssim_standard"], image_size=SIZE)
    gen, content, style = fixed_images()
    target = style.flip(-1)
    paired, unpaired = suite(gen, content, style, target), suite(gen, content, style)
    as_content = suite(gen, target, style)  # unpaired, with the target in the content's place
    for name in ("ssim", "ssim_standard"):
        assert paired[name].item() == as_content[name].item() != unpaired[name].item()


def test_images_are_resized_to_the_metric_size():
    from stylevar.metrics.suite import prepare

    x = torch.rand(2, 3, 100, 60)
    assert prepare(x, "x").shape == (2, 3, 256, 256)
    assert prepare(x, "x", 64).shape == (2, 3, 64, 64)
    small = fixed_images(64)
    big = [F.interpolate(x, size=256, mode="bilinear") for x in small]
    suite = metrics.MetricSuite(["ssim"], image_size=64)
    assert suite(*big)["ssim"].item() == pytest.approx(suite(*small)["ssim"].item(), abs=0.02)


@pytest.mark.slow
def test_style_and_content_loss_follow_the_definition(cache):
    losses = VGGLosses.from_file()
    gen, content, style = fixed_images(32)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)

    def taps(img):  # run the torchvision layers one by one, cloning each output (in-place ReLUs)
        x, out = (img - mean) / std, {}
        for i, layer in enumerate(losses.features):
            x = layer(x)
            out[i] = x.clone()
        return out

    tg, ts, tc = taps(gen), taps(style), taps(content)
    style_expected = sum(((gram_matrix(tg[i]) - gram_matrix(ts[i])) ** 2).mean() for i in STYLE_LAYERS)
    content_expected = ((tg[CONTENT_LAYER] - tc[CONTENT_LAYER]) ** 2).mean()
    out = losses(gen, content, style)
    assert out["style_loss"].item() == pytest.approx(style_expected.item(), rel=1e-5)
    assert out["content_loss"].item() == pytest.approx(content_expected.item(), rel=1e-5)
    assert (tg[CONTENT_LAYER] < 0).any()  # the tap is before the ReLU


@pytest.mark.slow
def test_compute_function_and_alexnet_backbone(cache):
    gen, content, style = fixed_images()
    assert metrics.compute("ssim", gen, content, style).item() == pytest.approx(
        ssim(*(F.interpolate(x, size=256, mode="bilinear", antialias=True) for x in (gen, content))).item(), abs=1e-6)
    alex = metrics.compute("lpips", gen, content, style, lpips_net="alex")
    assert alex.shape == (1,) and alex.item() != pytest.approx(PINNED["lpips"], rel=1e-3)  # VGG-16's value
    assert abs(metrics.compute("lpips", gen, gen, style, lpips_net="alex").item()) < 1e-6


@pytest.mark.slow
def test_dreamsim_left_torch_hub_as_it_was(slow_results):  # DreamSim was loaded by the fixture
    assert torch.hub.get_dir() == str(Path(os.environ["TORCH_HOME"]) / "hub")
    assert "vision_transformer" not in sys.modules and "hubconf" not in sys.modules


@pytest.mark.slow
def test_layout_errors_list_the_bad_keys(full_cache, tmp_path):
    from stylevar.metrics.perceptual import CLIPMetric

    sd = read_state_dict(weights.resolve("clip"))
    sd = dict(sd)
    del sd["visual.proj"]
    sd["visual.conv1.weight"] = torch.zeros(3, 3)
    sd["extra.key"] = torch.zeros(1)
    from safetensors.torch import save_file

    bad = tmp_path / "bad.safetensors"
    save_file(sd, str(bad))
    with pytest.raises(WeightMismatchError) as e:
        CLIPMetric.from_weights(bad)
    msg = str(e.value)
    assert "missing keys (1): visual.proj" in msg
    assert "unexpected keys (1): extra.key" in msg
    assert "visual.conv1.weight: file (3, 3) vs expected (768, 3, 32, 32)" in msg


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(full_cache):
    gen, content, style = fixed_images()
    out = metrics.MetricSuite(NAMES, device="cuda", image_size=SIZE)(gen, content, style)
    for name in NAMES:
        assert out[name].item() == pytest.approx(PINNED[name], rel=2e-3, abs=1e-5), name
