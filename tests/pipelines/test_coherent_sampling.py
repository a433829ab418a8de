"""stylevar.pipelines.coherence and the keyed draws of stylevar.models.sampling: the noise depends on (seed, scale, position) alone,
follows the content's motion, the previous frame's tokens are reused where nothing changed, a cut starts afresh,
and the per-frame modes are exactly today's sampling (off = bit for bit)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from stylevar.pipelines.coherence import Coherence, FrameSampler, coherence_of, estimate_shift, shift_grid
from stylevar.models.sampling import candidates, keyed_sample, keyed_uniforms, make_generators, position_keys, sample

PHOTO = "stylevar/assets/photos/chelsea.png"


def test_keyed_uniforms_are_uniform_and_depend_on_key_and_entry_only():
    keys = position_keys(7, 3, torch.arange(64)[:, None].expand(64, 64), torch.arange(64)[None, :].expand(64, 64))
    u = keyed_uniforms(keys.flatten()[None], None, 256)  # (1, 4096, 256)
    assert u.shape == (1, 4096, 256) and float(u.min()) >= 0 and float(u.max()) < 1
    counts = torch.histc(u, bins=16, min=0, max=1)
    expected = u.numel() / 16
    assert float(((counts - expected) ** 2 / expected).sum()) < 60  # chi-square, 15 degrees of freedom
    # neighbouring positions and entries are not correlated
    flat = u[0]
    assert abs(float(torch.corrcoef(torch.stack([flat[:-1].flatten(), flat[1:].flatten()]))[0, 1])) < 0.01
    assert abs(float(torch.corrcoef(torch.stack([flat[:, :-1].flatten(), flat[:, 1:].flatten()]))[0, 1])) < 0.01
    # the candidates' numbers are the full vocabulary's numbers at their entries
    idx = torch.randint(0, 256, (1, 4096, 5), generator=torch.Generator().manual_seed(0))
    assert torch.equal(keyed_uniforms(keys.flatten()[None], idx, 256), u.gather(-1, idx))
    # another seed or scale: other numbers
    other = position_keys(8, 3, torch.zeros(4, dtype=torch.long), torch.arange(4))
    assert not torch.equal(other, position_keys(7, 3, torch.zeros(4, dtype=torch.long), torch.arange(4)))
    assert not torch.equal(position_keys(7, 2, torch.zeros(4, dtype=torch.long), torch.arange(4)),
                           position_keys(7, 3, torch.zeros(4, dtype=torch.long), torch.arange(4)))


def test_keyed_draws_follow_the_filtered_distribution():
    logits_V = torch.randn(30, generator=torch.Generator().manual_seed(1)) * 1.5
    n = 60000
    keys = position_keys(0, 0, torch.arange(n), torch.zeros(n, dtype=torch.long))[None]
    for top_k, top_p in ((0, 0.0), (8, 0.0), (10, 0.9)):
        probs, idx = candidates(logits_V[None, None], top_k, top_p)
        want = torch.zeros(30).scatter(0, idx.flatten(), probs.flatten()) if idx is not None else probs.flatten()
        want = want / want.sum()
        tokens = keyed_sample(logits_V.expand(1, n, -1), keys, top_k, top_p)
        freq = torch.bincount(tokens.flatten(), minlength=30).float() / n
        assert (freq[want == 0] == 0).all()
        assert ((freq - want).abs() <= 5 * (want * (1 - want) / n).sqrt() + 1e-9).all(), (top_k, top_p)


def test_a_token_sampler_is_used_as_given_and_generators_are_untouched():
    calls = []

    def sampler(logits, top_k, top_p):
        calls.append((tuple(logits.shape), top_k, top_p))
        return logits.argmax(-1)

    assert make_generators(sampler, 2, torch.device("cpu")) is sampler
    logits = torch.randn(2, 4, 10)
    assert torch.equal(sample(logits, sampler, 3, 0.5), logits.argmax(-1)) and calls == [((2, 4, 10), 3, 0.5)]
    a = sample(logits, make_generators(5, 2, logits.device), 4, 0.9)  # the generators' path: as before
    assert torch.equal(a, sample(logits, make_generators(5, 2, logits.device), 4, 0.9))


def _photo(size=64) -> torch.Tensor:
    img = Image.open(PHOTO).convert("RGB").resize((96, 64), Image.BICUBIC)
    return torch.from_numpy(np.array(img)).permute(2, 0, 1).float() / 255


@pytest.mark.parametrize("d", [(3.0, 0.0), (-2.0, 1.0), (1.5, -0.5), (0.0, 0.0)])
def test_phase_correlation_finds_the_shift(d):
    big = _photo()
    base = big[:, :, 10:74]  # (3, 64, 64)
    moved, _ = shift_grid(big[None], torch.tensor([d]))
    b = moved[0, :, :, 10:74]
    g = torch.tensor((0.299, 0.587, 0.114)).view(3, 1, 1)
    est = estimate_shift((base * g).sum(0), (b * g).sum(0))
    assert torch.allclose(est, torch.tensor(d), atol=0.2), (est, d)


def test_shift_grid_moves_by_whole_pixels_exactly():
    x = torch.arange(2 * 5 * 6, dtype=torch.float32).view(1, 2, 5, 6)
    out, inside = shift_grid(x, torch.tensor([[2.0, -1.0]]))
    assert torch.equal(out[0, :, :4, 2:], x[0, :, 1:, :4]) and inside[0, 0, :4, 2:].all()
    assert not inside[0, 0, :, :2].any() and not inside[0, 0, 4].any()


def _frames(n: int, step: int, start: int = 0) -> torch.Tensor:
    """(n, 3, 32, 32) windows over the photograph moving `step` model pixels right per frame (content moves left)."""
    big = _photo()
    return torch.stack([big[:, 16:48, start + t * step:start + t * step + 32] for t in range(n)])


def _logits_following(frames: torch.Tensor, pn: int, V: int = 16) -> torch.Tensor:
    """Logits that are a function of the content under each token: (B, pn * pn, V)."""
    pooled = torch.nn.functional.adaptive_avg_pool2d(frames, pn)  # (B, 3, pn, pn)
    w = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    return torch.einsum("bchw,cv->bhwv", pooled, w).flatten(1, 2)


def test_anchored_noise_travels_with_the_content():
    frames = _frames(3, 4)  # 4 model pixels a frame = one token of an 8 x 8 grid over 32 pixels
    fs = FrameSampler(0, Coherence(anchor=True), (1, 8), side=32)
    motion = fs.begin(frames)
    assert torch.allclose(motion.raw_B2.diff(dim=0), torch.tensor([[-4.0, 0.0]] * 2), atol=0.3)
    keys = fs.keys(1).view(3, 8, 8)
    assert torch.equal(keys[1, :, :7], keys[0, :, 1:]) and torch.equal(keys[2, :, :6], keys[0, :, 2:])
    still = FrameSampler(0, Coherence(anchor=False), (1, 8), side=32)
    still.begin(frames)
    k2 = still.keys(1).view(3, 8, 8)
    assert torch.equal(k2[0], k2[1]) and torch.equal(k2[1], k2[2])


def test_static_frames_reuse_the_tokens_and_a_cut_starts_afresh():
    still = _frames(1, 0).expand(3, -1, -1, -1)
    other = 1 - still[:1]
    frames = torch.cat([still, other])
    fs = FrameSampler(3, Coherence(anchor=True, reuse_scales=2, blend=0.0), (1, 2, 4), side=32)
    motion = fs.begin(frames)
    assert motion.cut_B.tolist() == [True, False, False, True]
    noise = torch.Generator().manual_seed(1)
    for k, pn in enumerate((1, 2, 4)):
        logits = torch.randn(4, pn * pn, 16, generator=noise) * 0.1  # nearly flat: the draw is the noise's
        tokens = fs(logits, 0, 0.0)
        if k < 2:
            assert torch.equal(tokens[1], tokens[0]) and torch.equal(tokens[2], tokens[0])
    # the rows of one call are the frames of consecutive calls
    one_by_one = FrameSampler(3, Coherence(anchor=True, reuse_scales=2, blend=0.5), (1, 2, 4), side=32)
    batched = FrameSampler(3, Coherence(anchor=True, reuse_scales=2, blend=0.5), (1, 2, 4), side=32)
    batched.begin(frames)
    logits = [torch.randn(4, pn * pn, 16, generator=noise) for pn in (1, 2, 4)]
    together = [batched(lg, 4, 0.9) for lg in logits]
    for b in range(4):
        one_by_one.begin(frames[b:b + 1])
        for k, lg in enumerate(logits):
            assert torch.equal(one_by_one(lg[b:b + 1], 4, 0.9)[0], together[k][b]), (b, k)


def test_blending_keeps_tokens_where_the_distribution_wobbles():
    frames = _frames(8, 0)
    base = _logits_following(frames[:1], 8).expand(8, -1, -1)
    wobble = base + 0.6 * torch.randn(base.shape, generator=torch.Generator().manual_seed(2))
    changed = {}
    for blend in (0.0, 0.8):
        fs = FrameSampler(0, Coherence(blend=blend), (8,), side=32)
        fs.begin(frames)
        tokens = fs(wobble, 0, 0.0)
        changed[blend] = float((tokens[1:] != tokens[:-1]).float().mean())
    assert changed[0.8] < 0.6 * changed[0.0], changed


def test_modes():
    assert coherence_of("independent") is None and coherence_of("same-seed") is None
    assert coherence_of("coherent").align and coherence_of("coherent-reuse").reuse_scales == -1
    assert FrameSampler(0, coherence_of("coherent-reuse"), (1, 2, 4), side=16).reused == 2
    assert FrameSampler(0, coherence_of("coherent"), (1, 2, 4), side=16).quantum == 8
    with pytest.raises(ValueError, match="temporal mode"):
        coherence_of("smooth")
    with pytest.raises(ValueError, match="blend"):
        Coherence(blend=1.0)
    fs = FrameSampler(0, Coherence(), (1,), side=8)
    with pytest.raises(RuntimeError, match="begin"):
        fs(torch.zeros(1, 1, 4), 0, 0.0)


def test_the_aligned_canvas_moves_in_whole_tokens():
    frames = _frames(6, 3)  # 3 model pixels a frame; the canvas snaps to tokens of 32 / 4 = 8 pixels
    fs = FrameSampler(0, Coherence(align=True, align_scale=-2), (1, 4, 8), side=32)
    assert fs.quantum == 8
    motion = fs.begin(frames)
    assert torch.allclose(motion.raw_B2[:, 0], torch.tensor([0.0, -3, -6, -9, -12, -15]), atol=0.4)
    assert torch.equal(motion.offset_B2 % 8, torch.zeros(6, 2)) and (motion.phase_B2.abs() <= 4).all()
    assert torch.equal(motion.prev_offset_B2[1:], motion.offset_B2[:-1]) and torch.equal(motion.prev_offset_B2[0],
                                                                                         motion.offset_B2[0])
    later = fs.begin(_frames(7, 3)[6:])  # the next call goes on from the last frame
    assert torch.equal(later.prev_offset_B2[0], motion.offset_B2[-1]) and not bool(later.cut_B[0])


def test_settling_averages_with_the_moved_previous_drawing_and_not_across_a_cut():
    still = _frames(1, 0).expand(3, -1, -1, -1)
    frames = torch.cat([still, 1 - still[:1]])
    fs = FrameSampler(0, Coherence(align=True, settle=0.5), (1, 2, 4), side=32)
    fs.begin(frames)
    drawings = torch.stack([torch.full((3, 32, 32), v) for v in (0.0, 1.0, 1.0, 0.2)])
    out = fs.settle(drawings)
    assert torch.allclose(out[0], drawings[0]) and torch.allclose(out[1], torch.full((3, 32, 32), 0.5))
    assert torch.allclose(out[2], torch.full((3, 32, 32), 0.75)) and torch.allclose(out[3], drawings[3])  # a cut
    assert torch.equal(FrameSampler(0, Coherence(), (1,), side=32).settle(drawings), drawings)  # off: as it is
