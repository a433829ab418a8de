"""Content-guided refinement (stylevar.processing.refine): off by default and exact then, edges given back when on."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from stylevar.metrics.structure import edge_correlation
from stylevar.loaders.model_dir import PipelineConfig
from stylevar.pipelines.pipeline import StylePipeline
from stylevar.processing.refine import Refinement, refine


def _scene(seed: int = 0) -> torch.Tensor:
    """(2, 3, 32, 32) in [0, 1]: random rectangles on a gradient, so there are edges to keep."""
    g = torch.Generator().manual_seed(seed)
    img = torch.linspace(0, 1, 32).view(1, 1, 1, 32).expand(2, 3, 32, 32).clone() * 0.3
    for b in range(2):
        for _ in range(4):
            y, x = torch.randint(0, 24, (2,), generator=g).tolist()
            img[b, :, y:y + 8, x:x + 8] = torch.rand(3, 1, 1, generator=g)
    return img


def test_off_returns_the_output_unchanged():
    out = torch.rand(2, 3, 16, 16)
    assert refine(out, torch.rand(2, 3, 16, 16), Refinement()) is out


def test_edges_come_back_and_colours_stay():
    content = _scene()
    blurred = F.avg_pool2d(F.pad(content, (2, 2, 2, 2), mode="reflect"), 5, stride=1)  # a soft "model output"
    refined = refine(blurred, content, Refinement(radius=2, eps=1e-3))
    assert refined.shape == blurred.shape and 0 <= refined.min() and refined.max() <= 1
    before, after = edge_correlation(blurred, content).mean(), edge_correlation(refined, content).mean()
    assert after > before + 0.05, (before, after)
    # window means are kept: the image's mean colour barely moves
    assert (refined.mean(dim=(2, 3)) - blurred.mean(dim=(2, 3))).abs().max() < 0.01
    # a larger eps smooths more (closer to the window means, fewer of the content's edges)
    smoother = refine(blurred, content, Refinement(radius=2, eps=1.0))
    assert edge_correlation(smoother, content).mean() < after


def test_radius_is_capped_for_tiny_images_and_shapes_must_match():
    out = torch.rand(1, 3, 4, 4)
    assert refine(out, torch.rand(1, 3, 4, 4), Refinement(radius=8)).shape == out.shape
    with pytest.raises(ValueError, match="differ"):
        refine(out, torch.rand(1, 3, 8, 8), Refinement(radius=1))


def test_config_fields_are_checked():
    assert Refinement.from_dict(None) == Refinement() and not Refinement().enabled
    assert Refinement.from_dict({"radius": 3, "eps": 0.01}) == Refinement(3, 0.01)
    with pytest.raises(ValueError, match="unknown fields"):
        Refinement.from_dict({"radius": 3, "sigma": 1})
    with pytest.raises(ValueError, match="radius"):
        Refinement(radius=-1)
    with pytest.raises(ValueError, match="eps"):
        Refinement(radius=1, eps=0)


@pytest.mark.slow
def test_model_directory_records_it_and_the_pipeline_applies_it(tmp_path):
    pipe = StylePipeline.random("tiny", seed=0)
    content, style = Image.new("RGB", (40, 40), (200, 30, 30)), Image.new("RGB", (40, 40), (10, 10, 240))
    content.paste((20, 200, 20), (10, 10, 30, 30))
    plain = pipe(content, style, seed=3)
    off_dir = pipe.save_pretrained(tmp_path / "off")
    assert "refine" not in json.loads((off_dir / "config.json").read_text())  # published layout unchanged
    assert PipelineConfig.from_dir(off_dir).refine == Refinement()

    pipe.config.refine = Refinement(radius=2, eps=1e-3)
    on_dir = pipe.save_pretrained(tmp_path / "on")
    assert json.loads((on_dir / "config.json").read_text())["refine"] == {"radius": 2, "eps": 1e-3}
    loaded = StylePipeline.from_pretrained(on_dir, device="cpu")
    assert loaded.config.refine == Refinement(radius=2, eps=1e-3)
    refined = loaded(content, style, seed=3)
    assert refined.size == plain.size and refined.tobytes() != plain.tobytes()
    assert StylePipeline.from_pretrained(off_dir, device="cpu")(content, style, seed=3).tobytes() == plain.tobytes()
