"""StylePipeline.stylize_frames / stylize_video: the per-frame modes are exactly per-frame stylization, every mode
keeps the frames, frame rate, duration and audio, and blends, masks, guidance and the full-size upsampling work
for video as for images. Clips are made by tests/processing/test_video_io.py's `make_clip`."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("av")

from stylevar.processing.video import VideoError, VideoLimits, probe, read_frames  # noqa: E402
from tests.processing.test_video_io import FPS, N, audio_packets, frame_times, make_clip  # noqa: E402

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out

STYLE = Image.new("RGB", (32, 32), (200, 40, 90))
STYLE2 = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))


def frames_of(path) -> list[Image.Image]:
    return list(read_frames(path))


def same(a: Image.Image, b: Image.Image) -> bool:
    return a.size == b.size and np.array_equal(np.asarray(a), np.asarray(b))


def close(a: Image.Image, b: Image.Image) -> bool:
    """Equal but for the float rounding of batched rows (a row's matrix products depend on the batch's shape)."""
    return a.size == b.size and np.abs(np.asarray(a, dtype=float) - np.asarray(b, dtype=float)).mean() < 1.0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["independent", "same-seed"])
def test_per_frame_modes_are_per_frame_stylization(micro_pipeline, tmp_path, mode):
    frames = frames_of(make_clip(tmp_path / "c.mp4", frames=5))
    out = list(micro_pipeline.stylize_frames(frames, STYLE, temporal=mode, seed=11, batch_size=1))
    batched = list(micro_pipeline.stylize_frames(frames, STYLE, temporal=mode, seed=11, batch_size=3))
    for i, (frame, got) in enumerate(zip(frames, out)):
        seed = 11 + i if mode == "independent" else 11
        assert same(got, micro_pipeline(frame, STYLE, seed=seed)), i
        assert close(batched[i], got), i
        assert got.info["index"] == i and got.info["time_s"] == frame.info["time_s"]


def test_coherent_frames_do_not_depend_on_the_batch_size(micro_pipeline, tmp_path):
    frames = frames_of(make_clip(tmp_path / "c.mp4", frames=6))
    runs = [list(micro_pipeline.stylize_frames(frames, STYLE, temporal=mode, seed=3, batch_size=b))
            for mode in ("coherent", "coherent-reuse") for b in (1, 4)]
    for a, b in ((runs[0], runs[1]), (runs[2], runs[3])):
        assert all(close(x, y) for x, y in zip(a, b))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("audio", ["aac", None])
def test_stylize_video_keeps_frames_rate_duration_and_audio(micro_pipeline, tmp_path, audio):
    clip = make_clip(tmp_path / "c.mp4", audio=audio)
    seen = []
    result = micro_pipeline.stylize_video(clip, STYLE, tmp_path / "o.mp4", seed=0,
                                          progress=lambda done, total: seen.append((done, total)))
    info, source = probe(result.path), probe(clip)
    assert (info.frames, info.fps, info.width, info.height) == (N, Fraction(FPS), source.width, source.height)
    assert result.frames == N and result.duration_s == pytest.approx(1.0) and result.audio == bool(audio)
    assert info.duration_s == pytest.approx(1.0, abs=1 / FPS)
    assert frame_times(result.path) == pytest.approx(frame_times(clip), abs=1e-3)
    assert seen == [(i + 1, N) for i in range(N)]
    if audio:
        assert audio_packets(result.path) == audio_packets(clip)


def test_blends_masks_guidance_and_upsampling_work_for_video(micro_pipeline, tmp_path):
    frames = frames_of(make_clip(tmp_path / "c.mp4", frames=3, size=(96, 64)))
    mask = Image.new("L", (10, 10), 0)
    mask.paste(255, (0, 0, 5, 10))
    options = dict(style_weights=(0.7, 0.3), guidance=1.5, upsample="guided", seed=4, style_strength=0.3)
    out = list(micro_pipeline.stylize_frames(frames, [STYLE, STYLE2], temporal="same-seed",
                                             style_masks=[mask, mask.point(lambda v: 255 - v)], **options))
    for frame, got in zip(frames, out):
        want = micro_pipeline(frame, [STYLE, STYLE2], style_masks=[mask, mask.point(lambda v: 255 - v)], **options)
        assert same(got, want) and got.size == (96, 64)
    small = list(micro_pipeline.stylize_frames(frames, STYLE, max_side=48, preserve_color=True, temporal="coherent"))
    assert all(im.size == (48, 32) for im in small)


def test_bad_clips_and_options_are_refused_before_any_model_call(micro_pipeline, tmp_path):
    clip = make_clip(tmp_path / "c.mp4")
    with pytest.raises(VideoError, match="more than the limit of 5"):
        micro_pipeline.stylize_video(clip, STYLE, tmp_path / "o.mp4", limits=VideoLimits(max_frames=5))
    (tmp_path / "t.mp4").write_text("not a video")
    with pytest.raises(VideoError, match="not a recognised video"):
        micro_pipeline.stylize_video(tmp_path / "t.mp4", STYLE, tmp_path / "o.mp4")
    with pytest.raises(TypeError, match="num_samples"):
        list(micro_pipeline.stylize_frames(frames_of(clip)[:1], STYLE, num_samples=2))
    with pytest.raises(ValueError, match="temporal mode"):
        list(micro_pipeline.stylize_frames(frames_of(clip)[:1], STYLE, temporal="smooth"))
    assert not (tmp_path / "o.mp4").exists()
