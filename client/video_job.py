"""One video through a stream: decode, fuse frame by frame, encode with the input's timing.

:func:`fuse_video` is what ``facefuse fuse-video`` runs: :func:`~facefuse.client.video.probe`
first (a bad file is refused before anything is sent), then the frames through
:func:`~facefuse.client.stream.fuse_stream`, written by
:class:`~facefuse.client.video.VideoWriter` as they come back. Offline every frame is fused;
``live`` sends frames at the clip's own rate (a camera) and a frame the service dropped repeats
the last fused one, so the output keeps the input's frame count. Returns the per-frame report
(``--stats``): latency sent-to-received, dropped, and the summary keys ``latency_ms_p50``,
``latency_ms_p95`` and ``delivered_fps``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from facefuse.client.stream import fuse_stream
from facefuse.client.video import VideoWriter, probe, read_frames


def _paced(frames, live: bool):
    """(rgb, t) pairs, held back to the clip's own rate when ``live``; remembers each pts."""
    start = time.perf_counter()
    for rgb, t, pts in frames:
        if live:
            delay = start + t - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        yield rgb, t, pts


def fuse_video(
    url: str,
    source: bytes,
    target: str | Path,
    output: str | Path,
    instruction: str = "",
    live: bool = False,
    transport: str = "raw",
    max_in_flight: int = 4,
    timeout_s: float = 120.0,
    progress: bool = False,
    **options,
) -> dict:
    """Fuse every frame of ``target`` into ``output``; see the module docstring."""
    info = probe(target, "--target")
    options = {k: v for k, v in options.items() if v is not None}
    pts_of: dict[int, int] = {}
    originals: dict[int, np.ndarray] = {}

    def frames():
        for index, (rgb, t, pts) in enumerate(_paced(read_frames(target), live)):
            pts_of[index] = pts
            if live:
                originals[index] = rgb
            yield rgb, t

    bar = _progress(info.frames) if progress else None
    rows, last = [], None
    started = time.perf_counter()
    try:
        with VideoWriter(output, info) as writer:
            results = fuse_stream(
                url, source, frames(), instruction, live=live, max_in_flight=max_in_flight,
                transport=transport, timeout_s=timeout_s, **options,
            )  # fmt: skip
            for frame in results:
                rgb = frame.rgb
                if rgb is None:  # dropped (live): the last fused frame, or the input's own
                    rgb = last if last is not None else originals.get(frame.index)
                last = rgb if frame.rgb is not None else last
                originals.pop(frame.index, None)
                writer.write(rgb, pts_of.pop(frame.index))
                rows.append(
                    {
                        "frame": frame.index,
                        "latency_ms": round(frame.latency_ms, 2),
                        "dropped": frame.dropped,
                        "faces": frame.info.get("faces_found"),
                    }
                )
                if bar is not None:
                    bar[0].update(bar[1], advance=1)
    finally:
        if bar is not None:
            bar[0].stop()
    elapsed = time.perf_counter() - started
    return {"video": str(target), "output": str(output), "summary": summarise(rows, elapsed, info),
            "frames": rows}  # fmt: skip


def summarise(rows: list[dict], elapsed_s: float, info) -> dict:
    """The report's summary: frames, delivered, dropped, fps, x real time, latency p50/p95."""
    delivered = [r for r in rows if not r["dropped"]]
    latency = [r["latency_ms"] for r in delivered] or [0.0]
    fps = len(rows) / elapsed_s if elapsed_s > 0 else 0.0
    return {
        "frames": len(rows),
        "delivered": len(delivered),
        "dropped": len(rows) - len(delivered),
        "seconds": round(elapsed_s, 3),
        "fps": round(fps, 3),
        "delivered_fps": round(len(delivered) / elapsed_s, 3) if elapsed_s > 0 else 0.0,
        "x_real_time": round(fps / float(info.rate), 3) if info.rate else 0.0,
        "latency_ms_p50": round(float(np.percentile(latency, 50)), 2),
        "latency_ms_p95": round(float(np.percentile(latency, 95)), 2),
        "faces_found_share": round(
            sum(1 for r in delivered if r["faces"]) / max(len(delivered), 1), 4
        ),
    }


def _progress(total: int):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    class FramesPerSecond(TextColumn):
        def __init__(self):
            super().__init__("")

        def render(self, task):
            from rich.text import Text

            speed = task.finished_speed or task.speed
            return Text(f"{speed:5.1f} frames/s" if speed else "  ... frames/s")

    bar = Progress(
        TextColumn("fusing"), BarColumn(), MofNCompleteColumn(), FramesPerSecond(),
        TimeRemainingColumn(),
    )  # fmt: skip
    bar.start()
    return bar, bar.add_task("frames", total=max(total, 1))
