"""The streams a ``facefusion_stream`` model instance serves, keyed by correlation id.

Triton tells a Python model nothing when a client vanishes or a sequence idles out
(``../shared/docs/triton-on-cpu.md``, "Streams"), so the rules for when a stream dies live
here, each with a test:

* a stream starts with a request flagged START (``sequence_start``) and carrying A; at most
  :attr:`StreamLimits.max_streams` live at once, one more is answered "busy, retry" and no
  other stream notices;
* it ends after the frames it was sent when a request flagged END arrives;
* it is dropped when no request has come for :attr:`StreamLimits.idle_timeout_s` seconds and
  none is in flight (:meth:`StreamRegistry.expire`, which the model calls from a timer), or
  when a response cannot be delivered (the client disconnected: :meth:`StreamRegistry.cancel`).

A dropped or ended stream's state (A's analysis, tracks, residuals) is released at once: its
runner is closed and nothing else holds it. Everything here is thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from facefuse.core.errors import Busy, InvalidInput
from facefuse.diffusion.stream import StreamRunner


class StreamsBusy(Busy):
    """All stream slots are taken: retry later (the client backs off)."""

    def __init__(self, limit: int):
        super().__init__(f"{limit} streams already open")


@dataclass(frozen=True)
class StreamLimits:
    """The ``facefusion_stream`` model's bounds (its config parameters of these names)."""

    max_streams: int = 4
    max_in_flight: int = 4
    idle_timeout_s: float = 30.0
    max_frame_pixels: int = 1920 * 1080
    max_frames: int = 30 * 60 * 10  # ten minutes at 30 frames/s

    def __post_init__(self) -> None:
        checks = {
            "max_streams": 1 <= self.max_streams <= 256,
            "max_in_flight": 1 <= self.max_in_flight <= 64,
            "idle_timeout_s": 0.1 <= self.idle_timeout_s <= 3600,
            "max_frame_pixels": 64 * 64 <= self.max_frame_pixels <= 8192 * 8192,
            "max_frames": 1 <= self.max_frames <= 10_000_000,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"stream parameter {name} out of range: {getattr(self, name)!r}")

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> StreamLimits:
        """From a model config's parameters (strings); ValueError names a malformed one."""
        values = {}
        for name, kind in (("max_streams", int), ("max_in_flight", int),
                           ("idle_timeout_s", float), ("max_frame_pixels", int),
                           ("max_frames", int)):  # fmt: skip
            if name in params:
                try:
                    values[name] = kind(params[name])
                except ValueError:
                    raise ValueError(
                        f"stream parameter {name} must be a number, got {params[name]!r}"
                    ) from None
        return cls(**values)


@dataclass
class Stream:
    """One live stream: its runner, the first frame's size (every frame must keep it) and
    the counters INFO and the metrics report."""

    key: object
    runner: StreamRunner
    last_seen: float = field(default_factory=time.monotonic)
    frame_shape: tuple[int, int] | None = None
    frames: int = 0
    ending: bool = False

    def check_frame(self, shape: tuple[int, ...], limits: StreamLimits, field_name: str) -> None:
        """InvalidInput naming ``field_name`` for a frame this stream cannot take."""
        if len(shape) != 3 or shape[2] != 3:
            raise InvalidInput(field_name, f"must be an RGB frame [H, W, 3], got {list(shape)}")
        height, width = int(shape[0]), int(shape[1])
        if height < 16 or width < 16 or height * width > limits.max_frame_pixels:
            raise InvalidInput(
                field_name,
                f"must be 16x16 to {limits.max_frame_pixels} pixels, got {width}x{height}",
            )
        if self.frame_shape is None:
            self.frame_shape = (height, width)
        elif self.frame_shape != (height, width):
            h0, w0 = self.frame_shape
            raise InvalidInput(
                field_name, f"changed size mid-stream: {width}x{height} after {w0}x{h0}"
            )
        if self.frames >= limits.max_frames:
            raise InvalidInput(field_name, f"the stream is over its {limits.max_frames} frames")


class StreamRegistry:
    """The live streams of one model instance (see the module docstring)."""

    def __init__(self, limits: StreamLimits, on_close: Callable[[Stream, str], None] | None = None):
        self.limits = limits
        self.on_close = on_close
        self._streams: dict[object, Stream] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._streams)

    def start(self, key, make_runner: Callable[[], StreamRunner]) -> Stream:
        """A new stream under ``key`` (a START on a live key restarts it). StreamsBusy when
        every slot is taken; ``make_runner`` runs outside the lock (it analyses A)."""
        self.close(key, "restarted")
        with self._lock:
            if len(self._streams) >= self.limits.max_streams:
                raise StreamsBusy(self.limits.max_streams)
            self._streams[key] = None  # the slot is held while the session is built
        try:
            stream = Stream(key, make_runner())
        except BaseException:
            with self._lock:
                self._streams.pop(key, None)
            raise
        with self._lock:
            self._streams[key] = stream
        return stream

    def get(self, key) -> Stream:
        with self._lock:
            stream = self._streams.get(key)
        if stream is None:
            raise InvalidInput(
                "sequence_id", f"no open stream {key!r}: start one with sequence_start and A"
            )
        stream.last_seen = time.monotonic()
        return stream

    def close(self, key, reason: str) -> bool:
        """Finish and free the stream under ``key`` (False when there is none)."""
        with self._lock:
            stream = self._streams.get(key)
            if stream is None:
                return False
            del self._streams[key]
        stream.runner.close()
        if self.on_close is not None:
            self.on_close(stream, reason)
        return True

    def end_after_frames(self, key) -> None:
        """END: free the stream once the frames it was sent are answered (on a thread, so the
        caller does not wait)."""
        stream = self.get(key)
        stream.ending = True

        def finish():
            stream.runner.wait_idle()
            with self._lock:
                if self._streams.get(key) is not stream:
                    return  # restarted or dropped meanwhile
            self.close(key, "ended")

        threading.Thread(target=finish, daemon=True, name=f"facefuse-stream-end-{key}").start()

    def cancel(self, key) -> None:
        """The client is gone: drop the stream now."""
        self.close(key, "cancelled")

    def expire(self, now: float | None = None) -> list:
        """Drop the streams idle for longer than the timeout with nothing in flight."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [
                key
                for key, stream in self._streams.items()
                if stream is not None
                and now - stream.last_seen > self.limits.idle_timeout_s
                and stream.runner.in_flight == 0
            ]
        for key in idle:
            self.close(key, "idle")
        return idle

    def close_all(self) -> None:
        with self._lock:
            keys = [key for key, stream in self._streams.items() if stream is not None]
        for key in keys:
            self.close(key, "shutdown")
