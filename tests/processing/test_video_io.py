"""stylevar.processing.video: probing, streamed decoding, the mp4 writer with copied audio, and every bad input.

The clips are made here with PyAV itself (64x48, 12 frames at 12 fps, some with a sine as AAC or Opus).
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import weakref
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

av = pytest.importorskip("av")

from stylevar.processing import video  # noqa: E402
from stylevar.processing.video import VideoLimits, VideoWriter, probe, read_frames  # noqa: E402

W, H, N, FPS = 64, 48, 12, 12
REPO = Path(__file__).resolve().parents[2]


def picture(i: int, size: tuple[int, int] = (W, H), noise: bool = False) -> np.ndarray:
    """Frame i: a horizontal ramp that moves i pixels, a red marker at the top-left (or noise)."""
    w, h = size
    if noise:
        return np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
    x = (np.arange(w)[None, :] + 3 * i) % w
    arr = np.stack([np.broadcast_to(x * 255 // w, (h, w))] * 3, -1).astype(np.uint8)
    arr[:4, :4] = (255, 0, 0)
    return arr


def sine_frames(stream, seconds: float):
    """Audio frames of a 440 Hz sine for `seconds`, in the encoder's own sample format (mono, 48 kHz)."""
    ctx = stream.codec_context
    step, fmt = ctx.frame_size or 960, ctx.format.name
    for start in range(0, int(48000 * seconds), step):
        wave = 0.3 * np.sin(2 * np.pi * 440 * (np.arange(step) + start) / 48000)
        data = (wave * 32767).astype(np.int16) if fmt.startswith("s16") else wave.astype(np.float32)
        frame = av.AudioFrame.from_ndarray(data[None], format=fmt, layout="mono")
        frame.sample_rate, frame.pts = 48000, start
        yield frame


def write_sine(path, fmt: str, codec: str) -> None:
    with av.open(str(path), "w", format=fmt) as c:
        a = c.add_stream(codec, rate=48000, layout="mono")
        for frame in sine_frames(a, 0.5):
            c.mux(a.encode(frame))
        c.mux(a.encode(None))


def make_clip(path, *, frames=N, size=(W, H), fps=FPS, audio=None, fmt=None, rotation=None,
              faststart=False, noise=False, target=None) -> Path:
    """Write a clip with libx264 (the wheel's); `audio`: an encoder name; `target`: a file object instead."""
    options = {"movflags": "+faststart"} if faststart else {}
    with av.open(target if target is not None else str(path), "w", format=fmt, options=options) as c:
        v = c.add_stream("libx264", rate=fps, options={"preset": "ultrafast"})
        v.width, v.height, v.pix_fmt = size[0], size[1], "yuv420p"
        if rotation is not None:
            v.set_display_rotation(rotation)
        a = c.add_stream(audio, rate=48000, layout="mono") if audio else None
        for i in range(frames):
            c.mux(v.encode(av.VideoFrame.from_ndarray(picture(i, size, noise), "rgb24")))
        if a is not None:
            for frame in sine_frames(a, frames / fps):
                c.mux(a.encode(frame))
            c.mux(a.encode(None))
        c.mux(v.encode(None))
    return Path(path)


def audio_packets(path) -> tuple[str, int, int]:
    with av.open(str(path)) as c:
        stream = c.streams.audio[0]
        packets = [p for p in c.demux(stream) if p.dts is not None]
        return stream.codec_context.name, len(packets), sum(p.size for p in packets)


def frame_times(path) -> list[float]:
    with av.open(str(path)) as c:
        return [f.time for f in c.decode(video=0)]


def expect(error: type, path, *args, **kwargs) -> video.VideoError:
    """The VideoError that probing / reading `path` raises, with a one-line message naming the file."""
    with pytest.raises(error) as info:
        probe(path, *args, **kwargs)
        for _ in read_frames(path, *args, **kwargs):
            pass
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    return info.value


def test_probe_reads_the_header(tmp_path):
    clip = make_clip(tmp_path / "a.mp4", audio="aac")
    info = probe(clip)
    assert (info.width, info.height, info.fps, info.frames, info.frames_exact) == (W, H, Fraction(FPS), N, True)
    assert info.duration_s == pytest.approx(1.0) and info.codec == "h264"
    assert info.has_audio and info.audio_codecs == ("aac",)
    mkv = probe(make_clip(tmp_path / "a.mkv", fmt="matroska"))  # no frame count in a Matroska header
    assert (mkv.frames, mkv.frames_exact, mkv.duration_s) == (N, False, pytest.approx(1.0))
    assert not mkv.has_audio


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, audio", [("a.mp4", "aac"), ("o.mkv", "libopus"), ("silent.mp4", None)])
def test_round_trip_keeps_frames_rate_duration_and_audio(tmp_path, name, audio):
    clip = make_clip(tmp_path / name, audio=audio, fmt="matroska" if name.endswith("mkv") else None)
    info = probe(clip)
    out = tmp_path / "out.mp4"
    with VideoWriter(out, info, audio_from=clip) as writer:
        for image in read_frames(clip):
            assert image.mode == "RGB" and image.size == (W, H)
            writer.write(image, image.info["time_s"])
    back = probe(out)
    assert back.frames == N and back.fps == Fraction(FPS) and (back.width, back.height) == (W, H)
    assert back.duration_s == pytest.approx(1.0, abs=1 / FPS)
    assert frame_times(out) == pytest.approx(frame_times(clip), abs=1e-3)  # Matroska's: whole ms
    if audio:
        assert audio_packets(out) == audio_packets(clip)  # the same codec, packets and bytes: copied
    else:
        assert not back.has_audio
    first = np.asarray(next(read_frames(out)), dtype=float)
    assert np.abs(first - picture(0)).mean() < 8  # H.264 at crf 18 keeps the picture
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_writer_without_times_uses_the_frame_rate_and_crops_odd_sizes(tmp_path):
    out = tmp_path / "odd.mp4"
    with VideoWriter(out, Fraction(30000, 1001)) as writer:
        for i in range(N):
            writer.write(Image.fromarray(picture(i, (63, 47))))
    info = probe(out)
    assert (info.width, info.height, info.frames, info.fps) == (62, 46, N, Fraction(30000, 1001))
    assert frame_times(out) == pytest.approx([i * 1001 / 30000 for i in range(N)], abs=1e-4)
    assert info.codec == ("h264" if "libx264" in av.codecs_available else "mpeg4")


def test_rotation_metadata_is_applied(tmp_path):
    clip = make_clip(tmp_path / "r.mp4", rotation=-90)  # shown turned 90 degrees clockwise (a phone's portrait)
    assert (probe(clip).width, probe(clip).height) == (W, H)  # the stored picture
    first = np.asarray(next(read_frames(clip)))
    assert first.shape == (W, H, 3)
    assert first[1, -2, 0] > 200 and first[1, -2, 1] < 60  # the red top-left marker is now top-right


@pytest.mark.timeout(30)
def test_frames_are_yielded_as_they_are_decoded(tmp_path):
    clip = make_clip(tmp_path / "n.mp4", noise=True, faststart=True)
    data = clip.read_bytes()
    clip.write_bytes(data[: len(data) * 6 // 10])  # the header is whole; the last frames are cut off
    frames = read_frames(clip)
    first = next(frames)  # a reader that decoded the whole clip first would raise here
    assert first.info["index"] == 0
    ref = weakref.ref(first)
    del first
    second = next(frames)
    assert ref() is None and second.info["index"] == 1  # the reader keeps no frame it has yielded
    with pytest.raises(video.CorruptVideoError, match="decoding failed after [2-9] frames"):
        for _ in frames:
            pass


MEMORY_SCRIPT = """
import resource, sys
from stylevar.processing.video import read_frames
for _ in read_frames(sys.argv[1]): pass
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
count = sum(1 for _ in read_frames(sys.argv[2]))
print(count, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_peak_memory_does_not_grow_with_the_clip(tmp_path):
    size = (320, 240)  # 230 KB a frame: 400 frames held would be 92 MB
    short = make_clip(tmp_path / "short.mp4", frames=10, size=size)
    long = make_clip(tmp_path / "long.mp4", frames=400, size=size)
    done = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(short), str(long)], cwd=REPO, text=True,
                          capture_output=True, timeout=100, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    count, grown_mb = map(int, done.stdout.split())
    assert count == 400 and grown_mb < 30, done.stdout


def truncated(path: Path, fraction: float) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    return path


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind, error, words", [
    ("text", video.NotAVideoError, "not a recognised video"),
    ("empty", video.NotAVideoError, "empty file"),
    ("png", video.NotAVideoError, "an image"),
    ("wav", video.NotAVideoError, "not a recognised video"),
    ("audio_only", video.NotAVideoError, "no video stream"),
    ("mp4_without_index", video.CorruptVideoError, "header cannot be read"),  # the index (moov) is at the end
    ("mp4_cut", video.CorruptVideoError, "decoding failed"),
    ("mkv_cut", video.CorruptVideoError, "truncated video"),
    ("garbage_inside", video.CorruptVideoError, "corrupt"),
    ("unknown_codec", video.UnsupportedCodecError, "not supported"),
])
def test_bad_inputs_raise_their_code_quickly(tmp_path, kind, error, words):
    path = tmp_path / f"{kind}.bin"
    if kind == "text":
        path.write_text("hello, not a video\n" * 20)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "png":
        Image.new("RGB", (8, 8)).save(path, "PNG")
    elif kind == "wav":
        write_sine(path, "wav", "pcm_s16le")
    elif kind == "audio_only":
        write_sine(path, "mp4", "aac")
    elif kind == "mp4_without_index":
        truncated(make_clip(path, fmt="mp4"), 0.6)
    elif kind == "mp4_cut":
        truncated(make_clip(path, fmt="mp4", faststart=True, noise=True), 0.6)
    elif kind == "mkv_cut":
        truncated(make_clip(path, fmt="matroska", noise=True), 0.6)
    elif kind == "garbage_inside":  # the header whole, every frame's data overwritten
        data = bytearray(make_clip(path, fmt="mp4", faststart=True, noise=True).read_bytes())
        data[len(data) // 3:] = np.random.default_rng(0).bytes(len(data) - len(data) // 3)
        path.write_bytes(bytes(data))
    elif kind == "unknown_codec":  # the sample entry's codec tag renamed: no decoder knows it
        data = make_clip(path, fmt="mp4", faststart=True).read_bytes()
        path.write_bytes(data.replace(b"avc1", b"zzzz"))
    err = expect(error, path)
    assert words in str(err) and err.code == error.code


def test_a_missing_file_stays_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        probe(tmp_path / "missing.mp4")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("limits, error, words", [
    (VideoLimits(max_frames=5), video.VideoTooLongError, "12 frames"),
    (VideoLimits(max_duration_s=0.5), video.VideoTooLongError, "1.00 s long"),
    (VideoLimits(max_pixels=1000), video.VideoTooLargeError, "64x48 = 3072 pixels"),
])
def test_limits_are_checked_from_the_header_before_decoding(tmp_path, limits, error, words):
    clip = make_clip(tmp_path / "a.mp4")
    assert words in str(expect(error, clip, limits))
    frames = read_frames(clip, limits)
    with pytest.raises(error):
        next(frames)  # not one frame decoded
    probe(clip, VideoLimits(max_frames=N, max_duration_s=1.0, max_pixels=W * H))  # at the limits: accepted


class Unseekable(io.RawIOBase):
    """A write-only stream: the Matroska muxer can write no duration or index back into the header."""

    def __init__(self, f):
        self.f = f

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        return self.f.write(b)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("limits", [VideoLimits(max_frames=5), VideoLimits(max_duration_s=5 / FPS)])
def test_limits_are_checked_again_while_decoding(tmp_path, limits):
    path = tmp_path / "streamed.mkv"
    with open(path, "wb") as f:
        make_clip(path, fmt="matroska", frames=48, target=Unseekable(f))
    info = probe(path, limits)  # the header says nothing against the limits
    assert info.duration_s is None and info.frames is None
    seen = []
    with pytest.raises(video.VideoTooLongError, match="streamed.mkv: video"):
        for image in read_frames(path, limits):
            seen.append(image.info["index"])
    assert seen == [0, 1, 2, 3, 4]


def test_a_failed_write_leaves_no_output(tmp_path):
    out = tmp_path / "out.mp4"
    out.write_bytes(b"the old file")
    with pytest.raises(RuntimeError, match="stylization failed"):
        with VideoWriter(out, FPS) as writer:
            for i in range(3):
                writer.write(Image.fromarray(picture(i)))
            raise RuntimeError("stylization failed")
    assert out.read_bytes() == b"the old file" and sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4"]
    with pytest.raises(ValueError, match="is 32x32, the video 64x48"):
        with VideoWriter(tmp_path / "sizes.mp4", FPS) as writer:
            writer.write(Image.fromarray(picture(0)))
            writer.write(Image.new("RGB", (32, 32)))
    with pytest.raises(ValueError, match="no frames were written"):
        with VideoWriter(tmp_path / "empty.mp4", FPS):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4"]


def test_audio_an_mp4_cannot_carry_is_refused_before_any_work(tmp_path):
    clip = make_clip(tmp_path / "pcm.mkv", fmt="matroska", audio="pcm_s16le")
    with pytest.raises(video.UnsupportedCodecError, match="pcm_s16le audio cannot be copied") as info:
        VideoWriter(tmp_path / "out.mp4", probe(clip), audio_from=clip)
    assert info.value.code == "unsupported_codec" and not (tmp_path / "out.mp4").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["pcm.mkv"]


def test_without_libx264_the_writer_falls_back_to_mpeg4(tmp_path, monkeypatch):
    monkeypatch.setattr(av, "codecs_available", av.codecs_available - {"libx264"})
    out = tmp_path / "mpeg4.mp4"
    with VideoWriter(out, Fraction(30000, 1001)) as writer:
        for i in range(N):
            writer.write(Image.fromarray(picture(i)))
    info = probe(out)
    assert (info.codec, info.frames, info.fps) == ("mpeg4", N, Fraction(30000, 1001))
    assert np.abs(np.asarray(next(read_frames(out)), dtype=float) - picture(0)).mean() < 12
