"""Content-guided upsampling (stylevar.processing.upsample): known answers, strips equal to one piece, every surface."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from stylevar.processing.images import fit_square, pil_to_tensor
from stylevar.metrics.structure import edge_correlation
from stylevar.processing.upsample import Upsampling, detail_slopes, luminance, upscale

SIDE = 32


def photo_like(size: tuple[int, int], seed: int = 0) -> Image.Image:
    """A picture with edges at every scale: rectangles, a disc and fine stripes, in colour."""
    w, h = size
    g = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32) + g.uniform(0.2, 0.5, 3)
    for _ in range(6):
        x0, y0 = g.uniform(0, w * 0.8), g.uniform(0, h * 0.8)
        box = (xx > x0) & (xx < x0 + g.uniform(0.1, 0.4) * w) & (yy > y0) & (yy < y0 + g.uniform(0.1, 0.4) * h)
        img[box] = g.uniform(0, 1, 3)
    disc = (xx - w / 2) ** 2 + (yy - h / 2) ** 2 < (min(w, h) / 4) ** 2
    img[disc] *= 0.5 + 0.5 * (np.sin(xx[disc] / 1.5) > 0)[:, None]  # stripes finer than the model's pixels
    return Image.fromarray((img.clip(0, 1) * 255).astype(np.uint8), "RGB")


def low_res(content: Image.Image, mode: str = "stretch") -> tuple[torch.Tensor, object]:
    sq, fit = fit_square(content, SIDE, mode)
    return pil_to_tensor(sq), fit


def test_a_constant_drawing_stays_constant():
    content = photo_like((200, 150))
    seen, fit = low_res(content)
    flat = torch.full((3, SIDE, SIDE), 0.25)
    flat[1] = 0.6
    out = np.asarray(upscale(flat, seen, fit, content, None, Upsampling()))
    assert out.shape == (150, 200, 3)
    assert np.abs(out.astype(int) - np.array([64, 153, 64])).max() <= 1


def test_a_drawing_equal_to_the_downscaled_content_upsamples_to_nearly_the_content():
    content = photo_like((256, 192)).convert("L").convert("RGB")  # grey: every channel follows the luminance
    seen, fit = low_res(content)
    target = pil_to_tensor(content)[None]

    def error(mode: str) -> float:
        out = upscale(seen, seen, fit, content, None, Upsampling(mode=mode, radius=1, eps=1e-4))
        return float((pil_to_tensor(out)[None] - target).abs().mean())

    assert error("guided") < 0.35 * error("bicubic")
    out = pil_to_tensor(upscale(seen, seen, fit, content, None, Upsampling()))[None]
    assert float(edge_correlation(out, target)) > 0.9


def test_at_the_model_size_the_drawing_is_returned_as_it_is():
    content = photo_like((SIDE, SIDE))
    seen, fit = low_res(content)
    drawing = torch.rand(3, SIDE, SIDE, generator=torch.Generator().manual_seed(0))
    for mode in ("guided", "bicubic"):
        out = upscale(drawing, seen, fit, content, None, Upsampling(mode=mode))
        torch.testing.assert_close(pil_to_tensor(out), drawing, atol=1 / 255, rtol=0)


@pytest.mark.parametrize("mode", ["stretch", "pad", "crop"])
def test_strips_give_what_one_piece_gives(mode):
    content = photo_like((301, 187), seed=2)
    seen, fit = low_res(content, mode)
    drawing = torch.rand(3, SIDE, SIDE, generator=torch.Generator().manual_seed(1)) * 0.5 + seen * 0.5
    whole = np.asarray(upscale(drawing, seen, fit, content, None, Upsampling(strip_pixels=10**9)))
    for strip in (1, 300, 4096):
        strips = np.asarray(upscale(drawing, seen, fit, content, None, Upsampling(strip_pixels=strip)))
        assert np.abs(strips.astype(int) - whole.astype(int)).max() <= 1  # float rounding at most
    assert whole.shape[:2] == ((187, 301) if mode != "crop" else (187, 187))


def reference_guided(drawing: torch.Tensor, seen: torch.Tensor, fit, content: Image.Image,
                     cfg: Upsampling) -> np.ndarray:
    """The module doc's formula the plain way, in float64: the seven low-resolution planes resized at once by
    `F.interpolate`, the whole content's luma, then clamped and rounded."""
    import torch.nn.functional as F

    from stylevar.processing.images import result_size, to_levels
    from stylevar.processing.upsample import guide_image

    W, H = result_size(fit, None)
    left, top, right, bottom = fit.box
    levels = to_levels(drawing[:, top:bottom, left:right])
    seen_y = luminance(seen[None, :, top:bottom, left:right])
    slopes = detail_slopes(levels[None] / 255.0, seen_y, cfg.radius, cfg.eps)
    planes = torch.cat([cfg.strength * slopes, -255.0 * seen_y, levels[None]], 1).double()
    up = F.interpolate(planes, size=(H, W), mode="bilinear", align_corners=False)[0]
    luma = torch.from_numpy(np.asarray(guide_image(content, fit, (W, H)), np.float64) @ np.array([0.299, 0.587, 0.114]))
    out = up[4:] + up[:3] * (luma + up[3])
    return out.clamp(0, 255).round().permute(1, 2, 0).numpy()


@pytest.mark.parametrize("mode, size, side", [("stretch", (1024, 768), 64), ("crop", (301, 187), 32),
                                              ("pad", (640, 999), 48)])
def test_the_strips_compute_the_plain_formula(mode, size, side):
    """Against `reference_guided`: float32 against float64 may land a value on the other side of a half level
    (here on 0.01 % to 0.13 % of the values), nothing more."""
    content = photo_like(size, seed=5)
    sq, fit = fit_square(content, side, mode)
    seen = pil_to_tensor(sq)
    drawing = torch.rand(3, side, side, generator=torch.Generator().manual_seed(2)) * 0.6 + seen * 0.4
    cfg = Upsampling(strength=2.0, strip_pixels=50_000)
    out = np.asarray(upscale(drawing, seen, fit, content, None, cfg)).astype(np.float64)
    diff = np.abs(out - reference_guided(drawing, seen, fit, content, cfg))
    assert diff.max() <= 1 and (diff > 0).mean() < 5e-3, (diff.max(), (diff > 0).mean())


def test_the_row_runs_give_the_values_of_one_gather_and_lerp():
    """Each run of rows lerped from its two model rows, cut at any strip boundary, gives bit for bit what gathering
    every row's two model rows and one `lerp` over the whole image gives."""
    from stylevar.processing.upsample import _axis_weights, _Rows, _rows_into

    low_h7W = torch.randn(23, 7, 131, generator=torch.Generator().manual_seed(0)) * 100
    for H in (187, 23, 17):
        lo, hi, w = _axis_weights(H, 23, low_h7W.device)
        whole = torch.lerp(low_h7W.index_select(0, lo), low_h7W.index_select(0, hi), w[:, None, None])
        rows = _Rows.of(H, 23, low_h7W.device)
        for step in (1, 5, 64, H):
            out = torch.empty(H, 7, 131)
            for top in range(0, H, step):
                _rows_into(out[top:top + step], low_h7W, rows, top)
            assert torch.equal(out, whole), (H, step)


@pytest.mark.parametrize("radius", [1, 2, 4])
def test_the_box_filter_gives_the_values_of_avg_pool(radius):
    import torch.nn.functional as F

    from stylevar.processing.upsample import _box

    x = torch.randn(2, 8, 37, 29, generator=torch.Generator().manual_seed(radius))
    pooled = F.avg_pool2d(F.pad(x, (radius,) * 4, mode="replicate"), 2 * radius + 1, stride=1)
    assert torch.equal(_box(x, radius), pooled)


def test_the_strips_are_written_into_the_result_not_into_a_copy():
    """Beyond the result, the guided step holds strips: no whole-image array (numpy's allocations are traced; the
    result's own buffer is Pillow's). A 1500 x 1000 result would be 4.5 MB as one uint8 array."""
    import tracemalloc

    content = photo_like((1500, 1000), seed=3)
    seen, fit = low_res(content, "stretch")
    tracemalloc.start()
    try:
        out = upscale(seen, seen, fit, content, None, Upsampling(strip_pixels=30_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out.size == (1500, 1000) and peak < 1500 * 1000 * 3 / 4, peak


class HostCopies:
    """Counts the calls that bring a tensor to the host (on a GPU each waits for the device): `.cpu()`, `.item()`,
    `.tolist()`."""

    def __init__(self, monkeypatch):
        self.calls = 0
        for name in ("cpu", "item", "tolist"):
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(real))

    def _counted(self, real):
        def call(tensor, *args, **kwargs):
            self.calls += 1
            return real(tensor, *args, **kwargs)
        return call


def test_the_guided_result_comes_to_the_host_once_not_once_per_strip(monkeypatch):
    """Issue 60, point 10: the strips were copied to the host one by one (a device sync per strip). On the host
    they are pasted with no copy at all; on a device (here its path run on CPU tensors) they are gathered there and
    brought over once, the result unchanged."""
    from stylevar.processing import upsample

    content = photo_like((300, 200), seed=4)
    seen, fit = low_res(content)
    cfg = Upsampling(strip_pixels=300 * 10)  # 20 strips
    expected = np.asarray(upscale(seen, seen, fit, content, None, cfg))
    copies = HostCopies(monkeypatch)
    assert np.array_equal(np.asarray(upscale(seen, seen, fit, content, None, cfg)), expected)
    assert copies.calls == 0
    monkeypatch.setattr(upsample, "_pasted", lambda strips, size: upsample._gathered(strips, size, seen.device))
    assert np.array_equal(np.asarray(upscale(seen, seen, fit, content, None, cfg)), expected)
    assert copies.calls == 1


def test_max_side_and_the_guide_frame_follow_unfit():
    content = photo_like((400, 200))
    for mode, size in (("stretch", (120, 60)), ("pad", (120, 60)), ("crop", (120, 120))):
        seen, fit = low_res(content, mode)
        assert upscale(seen, seen, fit, content, 120, Upsampling()).size == size


def test_slopes_of_known_relations():
    g = torch.Generator().manual_seed(0)
    y = torch.rand(1, 1, 16, 16, generator=g)
    drawing = torch.cat([2 * y, -y + 1, torch.full_like(y, 0.3)], 1)  # follows, inverts, ignores the content
    a = detail_slopes(drawing, y, radius=2, eps=1e-6)
    torch.testing.assert_close(a[0, 0], torch.full((16, 16), 2.0), atol=2e-3, rtol=0)
    torch.testing.assert_close(a[0, 1], torch.full((16, 16), -1.0), atol=2e-3, rtol=0)
    torch.testing.assert_close(a[0, 2], torch.zeros(16, 16), atol=1e-4, rtol=0)
    assert luminance(torch.ones(1, 3, 2, 2)).allclose(torch.ones(1, 1, 2, 2))


@pytest.mark.parametrize("bad", [{"mode": "nearest"}, {"strength": -0.1}, {"strength": float("nan")},
                                 {"radius": 0}, {"eps": 0.0}, {"strip_pixels": 0}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        Upsampling(**bad)


def test_config_round_trip_and_unknown_fields():
    cfg = Upsampling(mode="bicubic", strength=0.5, radius=3, eps=1e-2)
    assert Upsampling.from_dict(cfg.to_dict()) == cfg
    assert Upsampling.from_dict(None) == Upsampling()
    with pytest.raises(ValueError, match="unknown fields"):
        Upsampling.from_dict({"sigma": 1})


# ------------------------------------------------------------------------------------------ surfaces
@pytest.fixture(scope="module")
def pipe():
    from stylevar.pipelines.pipeline import StylePipeline
    from tests.conftest import micro_configs

    return StylePipeline.random(micro_configs(), seed=0)


@pytest.mark.slow
def test_the_python_api_passes_the_option_and_refuses_bad_values(pipe):
    content, style = photo_like((160, 120)), photo_like((40, 40), seed=5)
    guided = pipe(content, style, seed=0)
    bicubic = pipe(content, style, seed=0, upsample="bicubic")
    assert guided.size == bicubic.size == (160, 120)
    assert np.asarray(guided).tobytes() != np.asarray(bicubic).tobytes()
    assert np.asarray(pipe(content, style, seed=0, upsample="guided")).tobytes() == np.asarray(guided).tobytes()
    with pytest.raises(ValueError, match="upsample"):
        pipe(content, style, seed=0, upsample="lanczos")


def test_a_model_directory_can_set_its_upsampling(pipe, tmp_path):
    import dataclasses

    from stylevar.loaders.model_dir import PipelineConfig

    cfg = dataclasses.replace(pipe.config, upsample=Upsampling(mode="bicubic"))
    assert PipelineConfig.from_dict(cfg.to_dict()).upsample == Upsampling(mode="bicubic")
    assert "upsample" not in pipe.config.to_dict()  # the default is not written: model directories unchanged


@pytest.mark.slow
def test_cli_option(tiny_model_dir, tmp_path):
    from stylevar.cli import main

    content, style = tmp_path / "c.png", tmp_path / "s.png"
    photo_like((128, 96)).save(content)
    photo_like((40, 40), seed=3).save(style)
    outs = {}
    for mode in ("guided", "bicubic"):
        out = tmp_path / f"{mode}.png"
        assert main(["stylize", str(content), str(style), "-o", str(out), "--upsample", mode, "--max-size", "128",
                     "--model", str(tiny_model_dir)]) == 0
        outs[mode] = np.asarray(Image.open(out))
    assert outs["guided"].shape == outs["bicubic"].shape == (96, 128, 3)
    assert outs["guided"].tobytes() != outs["bicubic"].tobytes()
    with pytest.raises(SystemExit) as e:
        main(["stylize", str(content), str(style), "-o", str(tmp_path / "x.png"), "--upsample", "nearest"])
    assert e.value.code == 2


def test_web_client_sends_the_option():
    from stylevar.pipelines.request import StylizeRequest
    from web.client import form_fields

    assert form_fields(StylizeRequest(upsample="bicubic"))["upsample"] == "bicubic"
    assert "upsample" not in form_fields(StylizeRequest())
