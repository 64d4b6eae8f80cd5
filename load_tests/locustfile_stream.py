"""Locust load test for video streams: each user fuses clips over ``facefusion_stream`` (gRPC
bidirectional streaming), one stream after another.

Run (headless, step load, CSV out; loopback only, bounded in time)::

    locust -f load_tests/locustfile_stream.py --headless --host grpc://127.0.0.1:8001 \\
        --csv reports/locust-stream --run-time 5m

Locust's statistics get one entry per frame, ``stream frame`` (response time: sent to received,
so the per-frame latency), ``stream frame [dropped]`` for live frames the server dropped (the
newest wins; a success), ``stream`` per clip (response time: the whole clip; length: frames
answered), ``stream [busy]`` when the server holds its maximum of streams (a failure, then the
user retries after a backoff). At the end each user's frames/s and latency p50/p95 are printed
and, with ``--csv PREFIX``, written to ``PREFIX_stream_users.csv``.

Options (environment variables, all optional), besides the step load shape of
``locustfile.py`` (``FACEFUSE_MAX_USERS``, ``FACEFUSE_STEP_USERS``, ``FACEFUSE_STEP_SECONDS``,
``FACEFUSE_DURATION``):

- ``FACEFUSE_CLIP``: a video file whose frames are B (default: 16 frames of a bundled photo
  panning slowly); ``FACEFUSE_SOURCE``: A's photo (default: the other bundled photo);
- ``FACEFUSE_STREAM_FRAMES``: frames per clip (default 16, at most the clip's);
- ``FACEFUSE_LIVE``: 1 sends frames at ``FACEFUSE_FPS`` (default 25) as a camera would, and the
  server drops what it cannot serve in time; 0 (default) sends as fast as the stream's bound
  (``FACEFUSE_IN_FLIGHT`` frames in flight, default 4) allows;
- ``FACEFUSE_TRANSPORT``: raw (default) or jpeg; ``FACEFUSE_INSTRUCTION`` (default: none, a
  plain fusion).

gRPC streaming under Locust's gevent needs gRPC's own gevent integration
(``grpc.experimental.gevent.init_gevent``), called below before any channel exists: without it
the stream's callbacks never reach the greenlets and every stream hangs.
"""

from __future__ import annotations

import csv
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import grpc.experimental.gevent as grpc_gevent
import numpy as np
from facefuse.client.api import retryable
from facefuse.client.stream import fuse_stream
from locust import User, between, events, task
from locustfile import LOOPBACK, StepLoad, _env  # noqa: F401  (StepLoad: the load shape)

from facefuse.core.samples import astronaut_png, grace_hopper_jpeg

grpc_gevent.init_gevent()


def load_clip() -> list[tuple[np.ndarray, float]]:
    """B's frames as (rgb, seconds) pairs."""
    count = int(_env("FACEFUSE_STREAM_FRAMES", "16"))
    if count < 1:
        raise SystemExit(f"FACEFUSE_STREAM_FRAMES={count}: must be at least 1")
    path = os.environ.get("FACEFUSE_CLIP")
    if path:
        from facefuse.client.video import read_frames

        frames = []
        for rgb, seconds, _pts in read_frames(Path(path), "FACEFUSE_CLIP"):
            frames.append((rgb, seconds))
            if len(frames) == count:
                break
        if not frames:
            raise SystemExit(f"FACEFUSE_CLIP={path}: no frames decoded")
        return frames
    from facefuse.face.imageio import decode_image

    rgb = decode_image(astronaut_png(), "TARGET_IMAGE")
    return [(np.ascontiguousarray(np.roll(rgb, 2 * i, axis=1)), i / 25.0) for i in range(count)]


def load_source() -> bytes:
    path = os.environ.get("FACEFUSE_SOURCE")
    return Path(path).read_bytes() if path else grace_hopper_jpeg()


CLIP = load_clip()
SOURCE = load_source()
USERS: dict[int, dict] = {}  # per user: frames, seconds streaming, latencies (ms)
_USER_IDS = iter(range(1, 1 << 30))
_LOCK = threading.Lock()


def _paced(frames, fps: float):
    """The clip at a camera's pace (gevent-patched sleep)."""
    begun = time.perf_counter()
    for index, item in enumerate(frames):
        pause = begun + index / fps - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        yield item


class StreamUser(User):
    """One user: opens a stream per clip, sends its frames, reads every answer."""

    wait_time = between(0.0, 0.5)

    def on_start(self) -> None:
        url = urlparse(self.host)
        if url.hostname not in LOOPBACK:  # never connect elsewhere
            raise SystemExit(f"--host {self.host}: this load test targets loopback only")
        self.url = f"{url.hostname}:{url.port or 8001}"
        self.live = _env("FACEFUSE_LIVE", "0") == "1"
        self.fps = float(_env("FACEFUSE_FPS", "25"))
        self.in_flight = int(_env("FACEFUSE_IN_FLIGHT", "4"))
        self.transport = _env("FACEFUSE_TRANSPORT", "raw")
        self.instruction = _env("FACEFUSE_INSTRUCTION", "")
        self.backoff = 0.5
        with _LOCK:
            self.user_id = next(_USER_IDS)
            USERS[self.user_id] = {"frames": 0, "dropped": 0, "seconds": 0.0, "latency": []}

    def _record(self, name: str, response_time_ms: float, length: int, exception=None) -> None:
        self.environment.events.request.fire(
            request_type="stream",
            name=name,
            response_time=response_time_ms,
            response_length=length,
            exception=exception,
            context={"user": self.user_id},
        )

    @task
    def fuse_clip(self) -> None:
        frames = _paced(CLIP, self.fps) if self.live else CLIP
        mine = USERS[self.user_id]
        started = time.perf_counter()
        answered = 0
        try:
            for frame in fuse_stream(
                self.url, SOURCE, frames, instruction=self.instruction, live=self.live,
                max_in_flight=self.in_flight, transport=self.transport,
            ):  # fmt: skip
                answered += 1
                if frame.dropped:
                    mine["dropped"] += 1
                    self._record("stream frame [dropped]", frame.latency_ms, 0)
                    continue
                mine["frames"] += 1
                mine["latency"].append(frame.latency_ms)
                self._record("stream frame", frame.latency_ms, frame.rgb.nbytes)
        except Exception as exc:
            elapsed = 1000.0 * (time.perf_counter() - started)
            if retryable(exc):  # busy (the server's stream bound) or a model being replaced
                self._record("stream [busy]", elapsed, 0, exc)
                time.sleep(self.backoff)
                self.backoff = min(2 * self.backoff, 8.0)
            else:
                self._record("stream", elapsed, answered, exc)
            return
        self.backoff = 0.5
        seconds = time.perf_counter() - started
        mine["seconds"] += seconds
        error = None if answered == len(CLIP) else AssertionError(
            f"{answered} of {len(CLIP)} frames answered"
        )  # fmt: skip
        self._record("stream", 1000.0 * seconds, answered, error)


def user_summary() -> list[dict]:
    """Per user: frames fused, dropped, frames/s while streaming, latency p50/p95 (ms)."""
    rows = []
    for user_id, mine in sorted(USERS.items()):
        latency = np.asarray(mine["latency"] or [np.nan])
        rows.append({
            "user": user_id,
            "frames": mine["frames"],
            "dropped": mine["dropped"],
            "frames_per_s": round(mine["frames"] / mine["seconds"], 2) if mine["seconds"] else 0.0,
            "latency_ms_p50": round(float(np.percentile(latency, 50)), 1),
            "latency_ms_p95": round(float(np.percentile(latency, 95)), 1),
        })  # fmt: skip
    return rows


@events.test_stop.add_listener
def _report_users(environment, **_) -> None:
    rows = user_summary()
    for row in rows:
        print("stream user " + " ".join(f"{key}={value}" for key, value in row.items()))
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    if prefix and rows:
        with open(f"{prefix}_stream_users.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
