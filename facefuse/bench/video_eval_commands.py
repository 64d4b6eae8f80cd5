"""``facefuse video-eval``: real clips through the served stream, measured frame by frame.

For each clip, in one run against one server: the stream offline (every frame: frames/s, x real
time) and live (at the clip's rate: latency p50 / p95, delivered frames/s), the still API frame
by frame on the clip's first frames (the baseline, side by side: the ratio is printed), and the
figures of :mod:`facefuse.quality.video_eval` on the offline output (face found, identity,
mouth correlation, stability, faceless frames), with a strip of frames per clip.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

VIDEO_SUFFIXES = (".mp4", ".mpg", ".mov", ".mkv", ".webm", ".avi")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "video-eval",
        help="fuse real clips through the served stream and report speed, latency, identity, "
        "mouth correlation and stability against the still API frame by frame",
        description=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--clips", type=Path, nargs="+", required=True,
                        help="video files or folders of them")  # fmt: skip
    parser.add_argument("--source", type=Path, required=True, help="A's photo (held out)")
    parser.add_argument("--out", type=Path, required=True, help="report folder")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--url", default=None, help="a running server's gRPC URL instead")
    parser.add_argument("--instruction", default="")
    parser.add_argument(
        "--still-frames", type=int, default=20, help="frames per clip through the still API"
    )
    parser.add_argument("--identity-every", type=int, default=5)
    parser.add_argument("--no-live", action="store_true", help="skip the live run")
    parser.add_argument(
        "--parallel", type=int, default=2, metavar="N",
        help="also fuse each clip in N keyframe segments over N streams and measure the seams "
        "(0 or 1: skip)",
    )  # fmt: skip
    parser.set_defaults(func=run)


def clip_files(paths: list[Path]) -> list[Path]:
    found = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.iterdir() if p.suffix.lower() in VIDEO_SUFFIXES)
        else:
            found.append(path)
    return found


def still_fps(url: str, source: bytes, clip: Path, count: int, instruction: str) -> float:
    """Frames/s of the still ``facefusion`` API on the clip's first ``count`` frames (each
    frame encoded as PNG and sent alone, the way a user without a video path would)."""
    import itertools

    from facefuse.client.api import Client, ClientError
    from facefuse.client.video import read_frames
    from facefuse.face.imageio import encode_png

    frames = [rgb for rgb, _, _ in itertools.islice(read_frames(clip), count)]
    with Client(url, "grpc") as client:
        started = time.perf_counter()
        for rgb in frames:
            with contextlib.suppress(ClientError):  # a frame without a face: a 400, timed too
                client.fuse(source, encode_png(rgb), instruction or "swap the face")
        elapsed = time.perf_counter() - started
    return len(frames) / elapsed if elapsed > 0 else 0.0


def measure(
    clip: Path, output: Path, source_rgb, identity_every: int, seams: tuple = ()
) -> tuple[dict, object]:
    import numpy as np

    from facefuse.client.video import read_frames
    from facefuse.quality.fusion_eval import FaceMeter
    from facefuse.quality.video_eval import ClipMeter, strip

    meter = FaceMeter()
    face = meter.main_face(source_rgb)
    if face is None:
        raise SystemExit("video-eval: dlib finds no face in --source")
    clip_meter = ClipMeter(face.descriptor, identity_every, meter, seams=tuple(seams))
    frames_in, frames_out = [], []
    for (rgb_in, t, _), (rgb_out, _, _) in zip(read_frames(clip), read_frames(output)):
        changed = bool(np.any(rgb_in != rgb_out))
        clip_meter.add(rgb_in, rgb_out, t, changed)
        frames_in.append(rgb_in)
        frames_out.append(rgb_out)
    return clip_meter.summary(), strip(frames_in, frames_out)


def parallel_row(url: str, source: bytes, clip: Path, args, source_rgb) -> dict:
    """The clip fused in ``args.parallel`` segments: speed, and stability at the seams against
    the same clip's stability everywhere (a jump at a seam shows as a larger ratio)."""
    from facefuse.client.video_job import fuse_video

    output = args.out / f"{clip.stem}-parallel.mp4"
    summary = fuse_video(url, source, clip, output, args.instruction,
                         parallel=args.parallel)["summary"]  # fmt: skip
    seams = tuple(s["first"] for s in summary["segments"][1:])
    quality, _ = measure(clip, output, source_rgb, identity_every=10**9, seams=seams)
    keys = ("seams", "seams_measured", "seam_stability_ratio", "stability_ratio")
    return {"summary": summary, **{k: quality.get(k) for k in keys}}


def run(args: argparse.Namespace) -> int:
    import cv2

    from facefuse.client.video_job import fuse_video
    from facefuse.face.imageio import decode_image
    from facefuse.serving.server import served_url

    clips = clip_files(args.clips)
    if not clips:
        raise SystemExit("video-eval: no clips found")
    args.out.mkdir(parents=True, exist_ok=True)
    source = args.source.read_bytes()
    source_rgb = decode_image(source, "--source")
    report = {"source": str(args.source), "instruction": args.instruction, "clips": {}}
    with served_url(args.repository, args.url, args.out / "server.log") as (url, where):
        report["server"] = where
        # a first stream after a server start pays the models' first runs (ORT sessions, the
        # detector threads): a short stream on the first clip takes it, unmeasured
        import itertools

        from facefuse.client.stream import fuse_stream
        from facefuse.client.video import read_frames

        warm = [(rgb, t) for rgb, t, _ in itertools.islice(read_frames(clips[0]), 12)]
        for _ in fuse_stream(url, source, warm, args.instruction):
            pass
        for clip in clips:
            name = clip.stem
            output = args.out / f"{name}.mp4"
            offline = fuse_video(url, source, clip, output, args.instruction)["summary"]
            row = {"offline": offline}
            if not args.no_live:
                live_out = args.out / f"{name}-live.mp4"
                row["live"] = fuse_video(url, source, clip, live_out, args.instruction,
                                         live=True)["summary"]  # fmt: skip
            if args.still_frames > 0:
                fps = still_fps(url, source, clip, args.still_frames, args.instruction)
                row["still_api_fps"] = round(fps, 3)
                row["stream_over_still"] = round(offline["fps"] / fps, 3) if fps else None
            row["quality"], picture = measure(clip, output, source_rgb, args.identity_every)
            if args.parallel > 1:
                row["parallel"] = parallel_row(url, source, clip, args, source_rgb)
            cv2.imwrite(
                str(args.out / f"{name}-strip.png"), cv2.cvtColor(picture, cv2.COLOR_RGB2BGR)
            )
            report["clips"][name] = row
            _print(name, row)
    (args.out / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out / 'report.json'}")
    return 0


def _print(name: str, row: dict) -> None:
    q, off = row["quality"], row["offline"]
    parts = [
        f"{name}: offline {off['fps']:.1f} frames/s ({off['x_real_time']:.2f}x real time)",
    ]
    if "still_api_fps" in row:
        parts.append(f"still API {row['still_api_fps']:.1f} ({row['stream_over_still']}x)")
    if "live" in row:
        live = row["live"]
        parts.append(
            f"live p50 {live['latency_ms_p50']:.0f} / p95 {live['latency_ms_p95']:.0f} ms, "
            f"{live['delivered_fps']:.1f} delivered/s"
        )
    if "parallel" in row:
        par = row["parallel"]
        parts.append(
            f"{len(par['summary']['segments'])} segments {par['summary']['fps']:.1f} frames/s, "
            f"seam stability {par['seam_stability_ratio']} (all {par['stability_ratio']})"
        )
    parts.append(
        f"face {q['face_found_share']}, d(A) {q['distance_a_median']}, nearer A "
        f"{q['nearer_a_share']}, mouth r {q['mouth_correlation']}, stability "
        f"{q['stability_ratio']}, faceless {q['faceless_frames']} "
        f"(min {q['faceless_psnr_min_db']} dB)"
    )
    print("; ".join(parts), flush=True)
