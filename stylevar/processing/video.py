"""Video in and out through PyAV (the `video` extra): header probing (`probe`, `count_frames`), frames decoded as
a stream (`read_frames`), and H.264 mp4 out with the audio copied (`VideoWriter`, written atomically).

Every limit (`VideoLimits`) is checked from the header and again on every frame; only `VIDEO_FORMATS` and local
files are opened, and every failure is a `VideoError` naming the file.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, get_args

from PIL import Image

from stylevar.utils.atomic import atomic_write_path, is_write_error, remove_quietly, temp_path, write_failure
from stylevar.utils.errors import CodedError
from stylevar.utils.extras import install_line

TemporalMode = Literal["independent", "same-seed", "coherent", "coherent-reuse"]
TEMPORAL_MODES: tuple[str, ...] = get_args(TemporalMode)
DEFAULT_TEMPORAL: TemporalMode = "coherent"
TEMPORAL_HELP = ("how the frames share their random draws: independent (frame i: seed + i), same-seed (every frame "
                 "the seed), coherent (the draws follow the content's motion, on a canvas that moves with it, each "
                 "drawing settled with the previous one), coherent-reuse (and all but the finest scale's tokens kept "
                 "where the content did not change)")
EXTRA = "video"  # pyproject.toml's extra that brings PyAV (stylevar.utils.extras)
VIDEO_FORMATS = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi,mpegts,flv,ogg,asf,mpeg"  # FFmpeg demuxer names
# audio codecs an mp4 carries as they are (others cannot be copied and are refused before any work)
MP4_AUDIO_CODECS = frozenset({"aac", "mp3", "mp2", "opus", "flac", "alac", "ac3", "eac3"})
OUTPUT_TIME_BASE = Fraction(1, 90000)
_IMAGE_BRANDS = (b"avif", b"avis", b"heic", b"heix", b"mif1", b"msf1")
_IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"BM", b"II*\x00", b"MM\x00*")
_TURN = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, -180: Image.Transpose.ROTATE_180,
         -90: Image.Transpose.ROTATE_270, 270: Image.Transpose.ROTATE_270}  # counterclockwise, as FFmpeg's
_VIDEO_MAGIC = ((b"\x1a\x45\xdf\xa3", "Matroska/WebM"), (b"OggS", "Ogg"), (b"FLV", "FLV"),
                (b"\x30\x26\xb2\x75", "ASF"), (b"\x00\x00\x01\xba", "MPEG"))


class VideoError(CodedError, ValueError):
    """Base class for input videos that cannot be used. ``code`` is a short machine-readable reason."""

    code = "bad_video"


class NotAVideoError(VideoError):
    code = "not_a_video"


class CorruptVideoError(VideoError):
    code = "corrupt_video"


class UnsupportedCodecError(VideoError):
    code = "unsupported_codec"


class VideoTooLongError(VideoError):
    code = "video_too_long"


class VideoTooLargeError(VideoError):
    code = "video_too_large"


@dataclass(frozen=True)
class VideoLimits:
    """What a caller accepts (None: no limit); ``max_pixels`` is per frame (width x height)."""

    max_duration_s: float | None = None
    max_frames: int | None = None
    max_pixels: int | None = None


@dataclass(frozen=True)
class VideoInfo:
    """A video stream as its container's header describes it (no frame decoded)."""

    width: int  # the stored picture's size (before any rotation metadata)
    height: int
    fps: Fraction
    frames: int | None  # None: the header does not say
    frames_exact: bool  # False: `frames` estimated from the duration and frame rate
    duration_s: float | None  # the video stream's, else the container's; None: the header does not say
    codec: str
    audio_codecs: tuple[str, ...]
    container: str

    @property
    def has_audio(self) -> bool:
        return bool(self.audio_codecs)


def _av() -> Any:
    try:
        import av
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"video needs PyAV: {install_line(EXTRA)}") from e
    return av


def probe(path: str | os.PathLike, limits: VideoLimits | None = None) -> VideoInfo:
    """The header of the video at ``path``; a :class:`VideoError` if it is not one or is over ``limits``."""
    with _open_input(path) as container:
        return _header(container, path, limits)[1]


def count_frames(path: str | os.PathLike, limits: VideoLimits | None = None) -> int:
    """The first video stream's frames, counted from its packets (none decoded), for headers that give no count or
    lie. A :class:`VideoError` at the first packet past ``limits`` (frames, or their timestamps' span)."""
    av = _av()
    with _open_input(path) as container:
        stream, info = _header(container, path, limits)
        frames, first, last = 0, None, None
        frame_s, time_base = 1 / float(info.fps), stream.time_base
        try:
            for packet in container.demux(stream):
                if packet.size == 0:  # the demuxer's end-of-stream marker
                    continue
                frames += 1
                if packet.pts is not None and time_base:
                    first = packet.pts if first is None else min(first, packet.pts)
                    last = packet.pts if last is None else max(last, packet.pts)
                span_s = float((last - first) * time_base) + frame_s if first is not None else frames * frame_s
                _check(limits, path, (info.width, info.height), frames, span_s, decoding=True)
        except av.FFmpegError as e:
            raise CorruptVideoError(f"{os.fspath(path)}: corrupt or truncated video (reading its packets failed "
                                    f"after {frames} frames: {e.strerror or type(e).__name__})") from e
    return frames


def read_frames(path: str | os.PathLike, limits: VideoLimits | None = None) -> Iterator[Image.Image]:
    """The first video stream's frames as upright RGB PIL images, ``info`` holding ``time_s`` and ``index``."""
    with _open_input(path) as container:
        stream, info = _header(container, path, limits)
        yield from _decoded(container, stream, info, limits, path)


def _decoded(container: Any, stream: Any, info: VideoInfo, limits: VideoLimits | None,
             path: str | os.PathLike) -> Iterator[Image.Image]:
    av = _av()
    frame_s = 1 / float(info.fps)
    index, start_s, end_s = 0, None, 0.0
    frames = container.decode(stream)
    while True:
        try:
            frame = next(frames, None)
        except av.error.DecoderNotFoundError as e:
            raise UnsupportedCodecError(f"{os.fspath(path)}: no decoder for its video codec") from e
        except av.FFmpegError as e:
            raise CorruptVideoError(f"{os.fspath(path)}: corrupt or truncated video (decoding failed after "
                                    f"{index} frames, {end_s:.2f} s: {e.strerror or type(e).__name__})") from e
        if frame is None:
            break
        time_s = frame.time if frame.time is not None else index * frame_s
        start_s = time_s if start_s is None else start_s
        end_s = time_s - start_s + frame_s
        _check(limits, path, (frame.width, frame.height), index + 1, end_s, decoding=True)
        image = _upright(frame)
        image.info.update(time_s=time_s, index=index)
        index += 1
        yield image
    if index == 0:
        raise CorruptVideoError(f"{os.fspath(path)}: corrupt video (no frame could be decoded)")
    expected_s = _stream_duration_s(stream)
    if expected_s is not None and end_s < expected_s - frame_s - 0.05:  # a frame of slack
        raise CorruptVideoError(f"{os.fspath(path)}: truncated video (its frames end at {end_s:.2f} s, "
                                f"its header says {expected_s:.2f} s)")


def _check(limits: VideoLimits | None, path: str | os.PathLike, size: tuple[int, int], frames: int | None,
           duration_s: float | None, *, decoding: bool) -> None:
    """Refuse a video over ``limits``: from its header, or (``decoding``) as far as it has been decoded."""
    if limits is None:
        return
    where, pixels, least = os.fspath(path), size[0] * size[1], "at least " if decoding else ""
    if limits.max_pixels is not None and pixels > limits.max_pixels:
        raise VideoTooLargeError(f"{where}: frames of {size[0]}x{size[1]} = {pixels} pixels, more than the limit "
                                 f"of {limits.max_pixels}")
    if limits.max_frames is not None and frames is not None and frames > limits.max_frames:
        raise VideoTooLongError(f"{where}: video has {least}{frames} frames, more than the limit of "
                                f"{limits.max_frames}")
    if limits.max_duration_s is not None and (duration_s or 0) > limits.max_duration_s + 1e-3:
        raise VideoTooLongError(f"{where}: video is {least}{duration_s:.2f} s long, more than the limit of "
                                f"{limits.max_duration_s:g} s")


def _header(container: Any, path: str | os.PathLike, limits: VideoLimits | None) -> tuple[Any, VideoInfo]:
    """The first video stream and its :class:`VideoInfo`, checked against ``limits``."""
    stream = _video_stream(container, path)
    info = _info(container, stream, path)
    _check(limits, path, (info.width, info.height), info.frames if info.frames_exact else None,  # estimates:
           info.duration_s, decoding=False)  # checked while decoding
    return stream, info


def _upright(frame: Any) -> Image.Image:
    """The frame as RGB, turned as its rotation metadata says (degrees counterclockwise, as PIL's)."""
    image, rotation = frame.to_image(), round(frame.rotation or 0)
    if rotation in _TURN:
        return image.transpose(_TURN[rotation])
    return image.rotate(rotation, expand=True) if rotation % 360 else image


def _open_input(path: str | os.PathLike) -> Any:
    """The container at ``path`` (a local file, one of :data:`VIDEO_FORMATS`), its header read."""
    av, where = _av(), os.fspath(path)  # a missing file stays FileNotFoundError
    try:
        with open(where, "rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise CorruptVideoError(f"{where}: cannot read the file ({e.strerror or e})") from e
    if head[4:8] == b"ftyp" and head[8:12] in _IMAGE_BRANDS:
        raise NotAVideoError(f"{where}: a still image (HEIF/AVIF), not a video")
    options = {"format_whitelist": VIDEO_FORMATS, "protocol_whitelist": "file"}
    try:
        return av.open("file:" + os.path.abspath(where), "r", container_options=options)
    except av.FFmpegError as e:
        raise _open_failure(where, head) from e


def _open_failure(where: str, head: bytes) -> VideoError:
    if not head:
        return NotAVideoError(f"{where}: empty file, not a video")
    if head.startswith(_IMAGE_MAGIC) or head[8:12] == b"WEBP":
        return NotAVideoError(f"{where}: an image, not a video")
    kind = "MP4/MOV" if head[4:8] in (b"ftyp", b"moov", b"mdat", b"wide", b"free") else \
        "AVI" if head[:4] == b"RIFF" and head[8:11] == b"AVI" else \
        next((name for magic, name in _VIDEO_MAGIC if head.startswith(magic)), None)
    if kind is not None:
        return CorruptVideoError(f"{where}: corrupt or truncated {kind} video (its header cannot be read)")
    return NotAVideoError(f"{where}: not a recognised video (accepted: MP4/MOV, MKV/WebM, AVI, MPEG-TS, ...)")


def _video_stream(container: Any, path: str | os.PathLike) -> Any:
    if not container.streams.video:
        kind = "audio only" if container.streams.audio else "no streams"
        raise NotAVideoError(f"{os.fspath(path)}: has no video stream ({kind}), not a video")
    stream = container.streams.video[0]
    if stream.codec_context is None:
        raise UnsupportedCodecError(f"{os.fspath(path)}: its video codec is not supported "
                                    "(no decoder for it in this FFmpeg build)")
    return stream


def _info(container: Any, stream: Any, path: str | os.PathLike) -> VideoInfo:
    fps = stream.average_rate or stream.guessed_rate or stream.base_rate
    if not fps:
        raise CorruptVideoError(f"{os.fspath(path)}: its header gives no frame rate")
    duration_s = _stream_duration_s(stream)
    if duration_s is None and container.duration:
        duration_s = container.duration / 1_000_000  # microseconds (FFmpeg's AV_TIME_BASE)
    exact = bool(stream.frames)
    frames = stream.frames if exact else (round(duration_s * fps) if duration_s else None)
    audio = tuple(s.codec_context.name if s.codec_context else "unknown" for s in container.streams.audio)
    return VideoInfo(width=stream.width, height=stream.height, fps=Fraction(fps), frames=frames,
                     frames_exact=exact, duration_s=duration_s, codec=stream.codec_context.name,
                     audio_codecs=audio, container=container.format.name)


def _stream_duration_s(stream: Any) -> float | None:
    """The video stream's own duration: its header field, else Matroska's DURATION tag (HH:MM:SS.fff)."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    try:
        hours, minutes, seconds = stream.metadata.get("DURATION", "").split(":")
        return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    except ValueError:
        return None


def _even(size: tuple[int, int]) -> tuple[int, int]:
    """yuv420p needs even sides: one column / row fewer when odd (2 for a side of 1)."""
    return tuple(max(2, side - side % 2) for side in size)  # type: ignore[return-value]


class VideoWriter:
    """``with VideoWriter("out.mp4", info, audio_from="in.mp4") as out: out.write(image, time_s)``.

    ``fps``: a :class:`VideoInfo` or a number; ``size`` (w, h): the first frame's when None. A frame's ``time_s``
    keeps the source's timing, else frame i is at i / fps. Nothing appears under ``path`` unless the block
    completes; a failed write is a WriteFailedError."""

    def __init__(self, path: str | os.PathLike, fps: VideoInfo | Fraction | float, size: tuple[int, int] | None = None,
                 *, audio_from: str | os.PathLike | None = None, crf: int = 18, preset: str = "medium"):
        av = _av()
        self.path = Path(path)
        self.fps = Fraction(fps.fps if isinstance(fps, VideoInfo) else fps).limit_denominator(1_000_000)
        if self.fps <= 0:
            raise ValueError(f"frame rate must be positive, not {fps}")
        self.size = size
        self.codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
        self._options = {"crf": str(crf), "preset": preset} if self.codec == "libx264" else {"qscale": "3"}
        self._time_base = OUTPUT_TIME_BASE if self.codec == "libx264" else 1 / self.fps
        self._source = self._open_audio(audio_from) if audio_from is not None else None
        self._tmp = temp_path(self.path)
        self._out = av.open(str(self._tmp), "w", format="mp4", options={"movflags": "+faststart"})
        self._video, self._audio, self._packets, self._pending = None, {}, None, None
        self._count, self._last_pts = 0, -1

    def _open_audio(self, source: str | os.PathLike) -> Any:
        container = _open_input(source)
        for stream in container.streams.audio:
            name = stream.codec_context.name if stream.codec_context else "unknown"
            if name not in MP4_AUDIO_CODECS:
                container.close()
                raise UnsupportedCodecError(f"{os.fspath(source)}: its {name} audio cannot be copied into an "
                                            f"mp4 (copied: {', '.join(sorted(MP4_AUDIO_CODECS))})")
        return container

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close() if exc_type is None else self.abort()

    def _start(self, size: tuple[int, int]) -> None:
        self.size = self.size or size
        self._video = self._out.add_stream(self.codec, rate=self.fps, options=self._options)
        self._video.width, self._video.height = _even(self.size)
        self._video.pix_fmt = "yuv420p"
        self._video.codec_context.time_base = self._time_base
        if self._source is not None and self._source.streams.audio:
            for stream in self._source.streams.audio:
                self._audio[stream.index] = self._out.add_stream_from_template(stream)
            self._packets = self._source.demux(*self._source.streams.audio)
            self._pending = self._next_audio()

    def write(self, image: Image.Image, time_s: float | None = None) -> None:
        """Encode one frame, at ``time_s`` seconds (default: the frame's index / fps)."""
        av = _av()
        if self._out is None:
            raise ValueError(f"{self.path}: the writer is closed")
        try:
            if self._video is None:
                self._start(image.size)
            if image.size != self.size:
                raise ValueError(f"frame {self._count} is {image.size[0]}x{image.size[1]}, "
                                 f"the video {self.size[0]}x{self.size[1]}")
            pts = max(round(self._on_grid(time_s) / self._time_base), self._last_pts + 1)
            frame = av.VideoFrame.from_image(image.convert("RGB").crop((0, 0, *_even(self.size))))
            frame.pts, frame.time_base = pts, self._time_base
            frame.duration = round(1 / (self.fps * self._time_base))
            self._mux_audio_until(float(pts * self._time_base))
            self._out.mux(self._video.encode(frame))
            self._count, self._last_pts = self._count + 1, pts
        except BaseException as e:
            self.abort()
            self._raise(e)

    def _on_grid(self, time_s: float | None) -> Fraction:
        """``time_s`` (default: index / fps), snapped to the frame-rate grid when within 1 ms of it."""
        if time_s is None:
            return self._count / self.fps
        index = round(time_s * self.fps)
        return index / self.fps if abs(time_s - index / self.fps) <= 1e-3 else Fraction(time_s)

    def _next_audio(self) -> Any:
        try:
            return next((p for p in self._packets if p.dts is not None), None)
        except _av().FFmpegError as e:
            raise CorruptVideoError(f"{self._source.name.removeprefix('file:')}: corrupt audio "
                                    f"({e.strerror or type(e).__name__})") from e

    def _mux_audio_until(self, time_s: float | None) -> None:
        """Copy the source's audio packets up to ``time_s`` (None: all that are left)."""
        while self._pending is not None:
            packet = self._pending
            if time_s is not None and packet.pts is not None and float(packet.pts * packet.time_base) > time_s:
                return
            packet.stream = self._audio[packet.stream.index]
            self._out.mux(packet)
            self._pending = self._next_audio()

    def close(self) -> Path:
        """Finish the mp4 and put it under ``path``; returns ``path``."""
        if self._out is None:
            return self.path
        try:
            if self._video is None:
                raise ValueError(f"{self.path}: no frames were written")
            self._out.mux(self._video.encode(None))
            self._mux_audio_until(None)
            self._out.close()  # the trailer, then faststart's rewrite
            self._out = None
        except BaseException as e:
            self.abort()
            self._raise(e)
        try:  # the mp4 is complete under temp_path(path): fsync it, rename it over path, fsync the folder
            return atomic_write_path(self.path, lambda tmp: None, what="video")
        finally:
            self.abort()  # closes the audio source (the temporary name is gone by now: renamed or removed)

    def abort(self) -> None:
        """Stop and remove the partial output (``path`` is left as it was)."""
        if self._out is not None:
            out, self._out = self._out, None
            try:
                out.close()
            except Exception:  # noqa: BLE001 - a broken output is removed below either way
                pass
        remove_quietly(self._tmp)
        if self._source is not None:
            self._source, source = None, self._source
            source.close()

    def _raise(self, exc: BaseException) -> None:
        """Re-raise ``exc``; a failed write (an OSError: disk full) as a WriteFailedError naming ``path``."""
        if isinstance(exc, VideoError) or not is_write_error(exc):
            raise exc
        raise write_failure(self.path, exc, what="video") from exc
