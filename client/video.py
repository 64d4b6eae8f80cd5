"""Video files in and out with PyAV (FFmpeg's libraries in a wheel), on the client side.

:func:`probe` checks a file before anything is sent (a video stream, frames, within the
duration and pixel limits) and raises InvalidInput naming ``field`` otherwise. :func:`read_frames`
yields each frame as contiguous RGB (PyAV hands views with padded rows; dlib and the mesh need
contiguous ones) with its time in seconds and its pts. :class:`VideoWriter` writes the fused
frames with the input's size, rate, time base, timestamps and rotation, and copies every audio
stream packet for packet (PyAV's remux recipe: ``add_stream_from_template``, no re-encode). It
writes to a hidden file beside the output and renames it only when the video is complete: an
interrupted run leaves no half-written output.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from facefuse.core.errors import InvalidInput

# output container by suffix -> (FFmpeg format, video codec, pixel format)
CONTAINERS = {
    ".mp4": ("mp4", "libx264", "yuv420p"),
    ".mov": ("mov", "libx264", "yuv420p"),
    ".mkv": ("matroska", "libx264", "yuv420p"),
    ".webm": ("webm", "libvpx-vp9", "yuv420p"),
}
# audio codecs each container takes as they are (anything else cannot be copied there)
AUDIO_OK = {
    "mp4": {"aac", "mp3", "mp2", "ac3", "eac3", "alac", "opus", "flac"},
    "mov": {"aac", "mp3", "mp2", "ac3", "alac", "pcm_s16le", "pcm_s24le"},
    "matroska": None,  # anything
    "webm": {"opus", "vorbis"},
}


STILL_FORMATS = {"image2", "png_pipe", "jpeg_pipe", "webp_pipe"}  # FFmpeg's still demuxers


@dataclass(frozen=True)
class VideoLimits:
    """What a client accepts before sending (the service bounds frames and streams itself)."""

    max_duration_s: float = 600.0
    max_pixels: int = 1920 * 1080


@dataclass(frozen=True)
class VideoInfo:
    path: Path
    width: int
    height: int
    rate: Fraction  # frames per second (average)
    time_base: Fraction
    frames: int  # the container's count, or an estimate from the duration
    duration_s: float
    codec: str
    rotation: int  # degrees, from the stream's display matrix or rotate tag
    audio: tuple[str, ...]  # the audio streams' codecs


def _open(path: Path, field: str):
    import av

    if not path.is_file():
        raise InvalidInput(field, f"file not found: {path}")
    try:
        return av.open(str(path))
    except (av.FFmpegError, OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(field, f"{path.name} is not a video PyAV can read ({exc})") from None


def probe(
    path: str | Path, field: str = "--target", limits: VideoLimits | None = None
) -> VideoInfo:
    """The video's :class:`VideoInfo`, or InvalidInput naming ``field``: not a video, no video
    stream, an unknown codec, no frames, over ``limits``."""
    limits = limits or VideoLimits()
    path = Path(path)
    with _open(path, field) as container:
        if not container.streams.video:
            raise InvalidInput(field, f"{path.name} has no video stream")
        if container.format.name in STILL_FORMATS or container.format.name.endswith("_pipe"):
            raise InvalidInput(field, f"{path.name} is a still image, not a video")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        if ctx is None or not ctx.name:
            raise InvalidInput(field, f"{path.name}: unknown video codec")
        width, height = int(ctx.width or 0), int(ctx.height or 0)
        if width < 16 or height < 16:
            raise InvalidInput(field, f"{path.name}: frames of {width}x{height} pixels")
        if width * height > limits.max_pixels:
            raise InvalidInput(
                field, f"{path.name}: {width}x{height} is over {limits.max_pixels} pixels"
            )
        rate = Fraction(stream.average_rate or stream.guessed_rate or 25)
        duration = _duration(container, stream)
        if duration > limits.max_duration_s:
            raise InvalidInput(
                field, f"{path.name}: {duration:.1f} s is over {limits.max_duration_s:.0f} s"
            )
        frames = int(stream.frames or round(duration * float(rate)))
        rotation = _rotation(stream)
        audio = tuple(a.codec_context.name for a in container.streams.audio)
        info = VideoInfo(path, width, height, rate, Fraction(stream.time_base), frames,
                         duration, ctx.name, rotation, audio)  # fmt: skip
        # one decoded frame proves the codec and that there are frames at all
        try:
            next(container.decode(stream))
        except StopIteration:
            raise InvalidInput(field, f"{path.name} has no frames") from None
        except Exception as exc:  # av.FFmpegError and friends: a codec FFmpeg cannot decode
            raise InvalidInput(field, f"{path.name}: cannot decode ({exc})") from None
    return info


def _duration(container, stream) -> float:
    if stream.duration is not None and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000
    return 0.0


def _rotation(stream) -> int:
    tag = (stream.metadata or {}).get("rotate")
    if tag is not None:
        with contextlib.suppress(ValueError):
            return int(tag) % 360
    for data in getattr(stream, "side_data", None) or ():
        value = getattr(data, "rotation", None)
        if value is not None:
            return round(float(value)) % 360
    return 0


def read_frames(
    path: str | Path, field: str = "--target", start_pts: int | None = None,
    end_pts: int | None = None,
) -> Iterator[tuple[np.ndarray, float, int]]:  # fmt: skip
    """(RGB uint8 contiguous, seconds, pts) for every frame, in presentation order; with
    ``start_pts``/``end_pts`` only the frames whose pts is in [start_pts, end_pts) (the decoder
    seeks to the keyframe at or before ``start_pts`` and skips what comes before it)."""
    path = Path(path)
    with _open(path, field) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        base = Fraction(stream.time_base)
        frames = _decode_from(container, stream, start_pts)
        index = 0
        for frame in frames:
            pts = frame.pts if frame.pts is not None else index
            index += 1
            if start_pts is not None and pts < start_pts:
                continue
            if end_pts is not None and pts >= end_pts:
                return
            yield np.ascontiguousarray(frame.to_ndarray(format="rgb24")), float(pts * base), pts


def _decode_from(container, stream, start_pts: int | None):
    """Decoded frames from at or before ``start_pts``. Seeking is exact in MP4 and WebM but
    not in every container (MPEG program streams land past the target): a seek whose first
    frame comes after ``start_pts`` is retried from further back, then from the start."""
    if start_pts is None or start_pts <= 0:
        return container.decode(stream)
    second = int(1 / stream.time_base) if stream.time_base else 1
    for back in (0, second, 5 * second, 30 * second):
        target = start_pts - back
        if target <= 0:
            break
        container.seek(target, stream=stream, backward=True, any_frame=False)
        frames = container.decode(stream)
        first = next(frames, None)
        if first is None:
            continue
        if first.pts is not None and first.pts <= start_pts:
            return itertools.chain([first], frames)
    container.seek(0, stream=stream, backward=True, any_frame=False)
    return container.decode(stream)


@dataclass(frozen=True)
class Segment:
    """Frames with pts in [start_pts, end_pts) (None: the clip's start or end); ``first`` is
    the index of its first frame in the clip, ``frames`` how many it holds."""

    start_pts: int | None
    end_pts: int | None
    first: int
    frames: int


def split_at_keyframes(path: str | Path, parts: int, field: str = "--target") -> list[Segment]:
    """At most ``parts`` segments of about equal frame counts, each starting at a keyframe (so
    each decodes on its own); packets are demuxed, nothing is decoded. A clip with fewer
    keyframes gives fewer segments."""
    if not 1 <= int(parts) <= 64:
        raise InvalidInput("--parallel", f"must be in 1..64, got {parts}")
    with _open(Path(path), field) as container:
        stream = container.streams.video[0]
        packets = [(p.pts, p.is_keyframe) for p in container.demux(stream)
                   if p.pts is not None and p.size]  # fmt: skip
    packets.sort()
    every = [pts for pts, _ in packets]
    keys = [i for i, (_, key) in enumerate(packets) if key and i > 0]
    starts = [0]
    for part in range(1, int(parts)):
        want = part * len(every) / parts
        if not keys:
            break
        best = min(keys, key=lambda i: abs(i - want))
        if best > starts[-1]:
            starts.append(best)
    segments = []
    for n, first in enumerate(starts):
        last = starts[n + 1] if n + 1 < len(starts) else len(every)
        segments.append(
            Segment(None if n == 0 else every[first],
                    every[last] if last < len(every) else None, first, last - first)
        )  # fmt: skip
    return segments


class VideoWriter:
    """Write fused frames to ``out`` with ``source``'s timing and audio (module docstring).

    ``write(rgb, pts)`` takes frames in order with the input's pts; ``close()`` copies the audio
    packets, finishes the file and moves it into place; leaving the ``with`` block on an error
    removes the partial file instead."""

    def __init__(self, out: str | Path, source: VideoInfo, crf: int = 18):
        import av

        self.out = Path(out)
        suffix = self.out.suffix.lower()
        if suffix not in CONTAINERS:
            raise InvalidInput(
                "--output", f"must end in one of {', '.join(CONTAINERS)}, got {self.out.name!r}"
            )
        self.format, codec, pix_fmt = CONTAINERS[suffix]
        allowed = AUDIO_OK[self.format]
        for name in source.audio:
            if allowed is not None and name not in allowed:
                raise InvalidInput(
                    "--output",
                    f"{suffix} cannot carry the input's {name} audio as it is; use .mkv or .mp4",
                )
        self.source = source
        self.out.parent.mkdir(parents=True, exist_ok=True)
        # FFmpeg creates it with the usual permissions (mkstemp's would be 0600)
        self.partial = self.out.parent / f".{self.out.stem}.{secrets.token_hex(6)}.partial"
        self.container = av.open(str(self.partial), "w", format=self.format)
        self.stream = self.container.add_stream(codec, rate=source.rate)
        self.stream.width, self.stream.height = source.width, source.height
        self.stream.pix_fmt = pix_fmt
        self.stream.time_base = source.time_base
        self.stream.codec_context.time_base = source.time_base
        options = {"crf": str(crf)}
        if codec == "libx264":
            options["preset"] = "veryfast"
        else:
            options.update({"b:v": "0", "deadline": "realtime", "cpu-used": "8"})
        self.stream.options = options
        if source.rotation:
            self.stream.metadata["rotate"] = str(source.rotation)
        # audio: every stream added now (before the header), packets muxed as the video
        # reaches their time so the file stays interleaved
        self._audio_in = av.open(str(source.path)) if source.audio else None
        self._audio_map = {}
        self._audio_packets = iter(())
        self._pending = None
        if self._audio_in is not None:
            for audio in self._audio_in.streams.audio:
                self._audio_map[audio.index] = self.container.add_stream_from_template(audio)
            self._audio_packets = self._audio_in.demux(list(self._audio_in.streams.audio))
        self.frames = 0
        self.audio_copied = 0
        self._last_pts: int | None = None

    def _pump_audio(self, until_s: float | None) -> None:
        """Mux the input's audio packets up to ``until_s`` seconds (None: all that is left)."""
        while True:
            packet = self._pending
            if packet is None:
                packet = next(self._audio_packets, None)
                if packet is None:
                    return
                if packet.dts is None:
                    continue
            if until_s is not None and float(packet.dts * packet.time_base) > until_s:
                self._pending = packet
                return
            self._pending = None
            packet.stream = self._audio_map[packet.stream.index]
            self.container.mux(packet)
            self.audio_copied += 1

    def write(self, rgb: np.ndarray, pts: int) -> None:
        import av

        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        if self._last_pts is not None and pts <= self._last_pts:
            pts = self._last_pts + 1  # the encoder needs increasing timestamps
        frame.pts, frame.time_base = pts, self.source.time_base
        self._last_pts = pts
        for packet in self.stream.encode(frame):
            self.container.mux(packet)
        self.frames += 1
        self._pump_audio(float(pts * self.source.time_base))

    def close(self) -> None:
        for packet in self.stream.encode():
            self.container.mux(packet)
        self._pump_audio(None)
        self.container.close()
        if self._audio_in is not None:
            self._audio_in.close()
        os.replace(self.partial, self.out)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.container.close()
        if self._audio_in is not None:
            with contextlib.suppress(Exception):
                self._audio_in.close()
        with contextlib.suppress(FileNotFoundError):
            self.partial.unlink()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def audio_packets(path: str | Path) -> list[bytes]:
    """Every audio packet's bytes in order (what a test compares in and out)."""
    import av

    with av.open(str(path)) as container:
        return [bytes(p) for p in container.demux(list(container.streams.audio)) if p.size]
