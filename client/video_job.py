"""One video through a stream: decode, fuse frame by frame, encode with the input's timing.

:func:`fuse_video` is what ``facefuse fuse-video`` runs: :func:`~facefuse.client.video.probe`
first (a bad file is refused before anything is sent), then the frames through
:func:`~facefuse.client.stream.fuse_stream`, written by
:class:`~facefuse.client.video.VideoWriter` as they come back. Offline every frame is fused;
``live`` sends frames at the clip's own rate (a camera) and a frame the service dropped repeats
the last fused one, so the output keeps the input's frame count. Returns the per-frame report
(``--stats``): latency sent-to-received, dropped, and the summary keys ``latency_ms_p50``,
``latency_ms_p95`` and ``delivered_fps``.

``parallel`` N > 1 splits the clip at keyframes (:func:`~facefuse.client.video.split_at_keyframes`)
and fuses the segments over N streams at once (N replicas behind one address fuse them up to N
times faster); the first segment is written as it comes, the others are spooled to lossless PNG
files beside the output until their turn. Each stream analyses A itself, so a segment's first
frame is fused as a stream's first frame always is.
"""

from __future__ import annotations

import contextlib
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from facefuse.client.stream import fuse_stream
from facefuse.client.video import Segment, VideoWriter, probe, read_frames, split_at_keyframes

from facefuse.core.errors import InvalidInput


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
    parallel: int = 1,
    on_frame: Callable[[int, int], None] | None = None,
    **options,
) -> dict:
    """Fuse every frame of ``target`` into ``output``; see the module docstring.
    ``on_frame(done, total)`` is called after each frame written (a page's progress bar)."""
    info = probe(target, "--target")
    options = {k: v for k, v in options.items() if v is not None}
    if parallel != 1:
        if live:
            raise InvalidInput("--parallel", "splits a clip over streams; not with --live")
        segments = split_at_keyframes(target, parallel)
        if len(segments) > 1:
            return _fuse_segments(
                url, source, target, output, info, segments, instruction,
                transport, max_in_flight, timeout_s, progress, options,
            )  # fmt: skip
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
                rows.append(_row(frame.index, frame))
                if bar is not None:
                    bar[0].update(bar[1], advance=1)
                if on_frame is not None:
                    on_frame(len(rows), info.frames)
    finally:
        if bar is not None:
            bar[0].stop()
    elapsed = time.perf_counter() - started
    return {"video": str(target), "output": str(output), "summary": summarise(rows, elapsed, info),
            "frames": rows}  # fmt: skip


def _row(index: int, frame, segment: int | None = None) -> dict:
    row = {"frame": index, "latency_ms": round(frame.latency_ms, 2), "dropped": frame.dropped,
           "faces": frame.info.get("faces_found")}  # fmt: skip
    if segment is not None:
        row["segment"] = segment
    return row


class _Spool:
    """One segment's fused frames on disk (lossless PNG, in order) until the writer reaches it."""

    def __init__(self, folder: Path, segment: int):
        self.folder = folder / f"segment-{segment:03d}"
        self.folder.mkdir()
        self.count = 0

    def put(self, rgb: np.ndarray) -> None:
        import cv2

        path = self.folder / f"{self.count:07d}.png"
        cv2.imwrite(
            str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 1]
        )
        self.count += 1

    def frames(self):
        import cv2

        for n in range(self.count):
            path = self.folder / f"{n:07d}.png"
            yield cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
            path.unlink()


def _fuse_segments(url, source, target, output, info, segments: list[Segment], instruction,
                   transport, max_in_flight, timeout_s, progress, options) -> dict:  # fmt: skip
    """``segments`` over one stream each, at once; written in order (module docstring)."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    spool_dir = Path(tempfile.mkdtemp(prefix=f".{output.stem}.segments.", dir=output.parent))
    head: queue.Queue = queue.Queue(maxsize=4 * max_in_flight)  # segment 0, written as it comes
    spools = [None] + [_Spool(spool_dir, n) for n in range(1, len(segments))]
    pts_of: list[dict[int, int]] = [{} for _ in segments]
    rows: list[list[dict]] = [[] for _ in segments]
    errors: list[BaseException] = []
    stop = threading.Event()
    bar = _progress(info.frames) if progress else None

    def frames(n: int, segment: Segment):
        for local, (rgb, t, pts) in enumerate(
            read_frames(target, "--target", segment.start_pts, segment.end_pts)
        ):
            pts_of[n][local] = pts
            yield rgb, t

    def run(n: int, segment: Segment) -> None:
        try:
            for frame in fuse_stream(url, source, frames(n, segment), instruction,
                                     max_in_flight=max_in_flight, transport=transport,
                                     timeout_s=timeout_s, **options):  # fmt: skip
                if stop.is_set():
                    return
                rows[n].append(_row(segment.first + frame.index, frame, n))
                if n == 0:
                    head.put((frame.index, frame.rgb))
                else:
                    spools[n].put(frame.rgb)
                if bar is not None:
                    bar[0].update(bar[1], advance=1)
        except BaseException as exc:
            errors.append(exc)
            stop.set()
        finally:
            if n == 0:
                head.put(None)

    threads = [threading.Thread(target=run, args=(n, segment), daemon=True,
                                name=f"facefuse-segment-{n}")
               for n, segment in enumerate(segments)]  # fmt: skip
    started = time.perf_counter()
    try:
        for thread in threads:
            thread.start()
        with VideoWriter(output, info) as writer:
            while (item := head.get()) is not None:
                writer.write(item[1], pts_of[0].pop(item[0]))
            for n in range(1, len(segments)):
                threads[n].join()
                if errors:
                    raise errors[0]
                for local, rgb in enumerate(spools[n].frames()):
                    writer.write(rgb, pts_of[n].pop(local))
            if errors:
                raise errors[0]
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):  # unblock a segment-0 thread waiting to put
            while True:
                head.get_nowait()
        if bar is not None:
            bar[0].stop()
        shutil.rmtree(spool_dir, ignore_errors=True)
    elapsed = time.perf_counter() - started
    flat = [row for part in rows for row in part]
    summary = summarise(flat, elapsed, info)
    summary["segments"] = [{"first": s.first, "frames": s.frames} for s in segments]
    return {"video": str(target), "output": str(output), "summary": summary, "frames": flat}


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
