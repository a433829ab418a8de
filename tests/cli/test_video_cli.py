"""`stylevar stylize clip.mp4 style.png -o out.mp4`: the round trip keeps frames, frame rate, duration and audio,
with a progress bar; bad clips and wrong outputs are exit 2 with one line, before any model loads."""
from __future__ import annotations

from fractions import Fraction

import pytest
from PIL import Image

pytest.importorskip("av")

from stylevar import cli  # noqa: E402
from stylevar.cli import stylize as stylize_cli  # noqa: E402
from stylevar.processing.video import DEFAULT_TEMPORAL, TEMPORAL_MODES, probe  # noqa: E402
from tests.processing.test_video_io import FPS, N, audio_packets, frame_times, make_clip, truncated  # noqa: E402

pytestmark = pytest.mark.slow  # the fast lane (-m "not slow") leaves this file out


@pytest.fixture
def style(tmp_path):
    path = tmp_path / "s.png"
    Image.new("RGB", (24, 24), (30, 160, 220)).save(path)
    return path


@pytest.mark.timeout(120)
def test_a_clip_round_trips(micro_model_dir, tmp_path, style, capsys):
    clip = make_clip(tmp_path / "c.mov", audio="aac", fmt="mov")
    out = tmp_path / "clips" / "o.mp4"  # its folder is made
    rc = cli.main(["stylize", str(clip), str(style), "-o", str(out), "--model", str(micro_model_dir),
                   "--device", "cpu", "--seed", "3", "--temporal", "coherent-reuse", "--batch-size", "5"])
    assert rc == 0
    captured = capsys.readouterr()
    assert f"{N}/{N}" in captured.err and "frame" in captured.err  # the progress bar
    assert f"wrote {out} (64x48, {N} frames at {FPS} fps, 1.00 s, audio copied" in captured.out
    info, source = probe(out), probe(clip)
    assert (info.frames, info.fps, info.width, info.height) == (N, Fraction(FPS), source.width, source.height)
    assert info.duration_s == pytest.approx(1.0, abs=1 / FPS)
    assert frame_times(out) == pytest.approx(frame_times(clip), abs=1e-3)
    assert audio_packets(out) == audio_packets(clip)


@pytest.mark.parametrize("kind, words", [
    ("text", "content video {p}: not a recognised video"),
    ("truncated_header", "content video {p}: corrupt or truncated MP4/MOV video"),
    ("missing", "content video not found: {p}"),
])
def test_bad_clips_are_one_line_and_exit_2(micro_model_dir, tmp_path, style, capsys, kind, words):
    path = tmp_path / "c.mp4"
    if kind == "text":
        path.write_text("no video here\n" * 10)
    elif kind == "truncated_header":
        truncated(make_clip(path), 0.5)
    rc = cli.main(["stylize", str(path), str(style), "-o", str(tmp_path / "o.mp4"), "--model", str(micro_model_dir)])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("stylevar stylize: error: " + words.format(p=path)), err
    assert not (tmp_path / "o.mp4").exists()


def test_a_clip_cut_short_inside_is_exit_2_and_leaves_nothing(micro_model_dir, tmp_path, style, capsys):
    path = truncated(make_clip(tmp_path / "c.mp4", faststart=True, noise=True), 0.6)
    rc = cli.main(["stylize", str(path), str(style), "-o", str(tmp_path / "o.mp4"), "--model", str(micro_model_dir),
                   "--device", "cpu"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"stylevar stylize: error: content video {path}: corrupt or truncated video")
    assert err.endswith("(nothing was written)") and not (tmp_path / "o.mp4").exists()


@pytest.mark.parametrize("args, words", [
    (["-o", "{t}/o.png"], "output {t}/o.png: a video is written as an H.264 .mp4"),
    (["-o", "{t}/c.mp4/o.mp4"], "output folder {t}/c.mp4 exists and is not a folder"),
    (["-o", "{t}/o.mp4", "--num-samples", "2"], "--num-samples: a video gives one output video"),
    (["-o", "{t}/o.mp4", "--format", "png"], "--format: a video is written as an .mp4"),
])
def test_wrong_outputs_are_refused(tmp_path, style, capsys, args, words):
    clip = make_clip(tmp_path / "c.mp4", frames=2)
    rc = cli.main(["stylize", str(clip), str(style), *[a.format(t=tmp_path) for a in args]])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("stylevar stylize: error: " + words.format(t=tmp_path)), err


def test_the_temporal_flag_is_the_library_s():
    args = cli.build_parser(["stylize"]).parse_args(["stylize", "c.mp4", "s.png", "-o", "o.mp4"])
    assert args.temporal == DEFAULT_TEMPORAL
    assert stylize_cli.TEMPORAL_MODES == TEMPORAL_MODES
    with pytest.raises(SystemExit):
        cli.build_parser(["stylize"]).parse_args(["stylize", "c.mp4", "s.png", "-o", "o.mp4", "--temporal", "x"])
