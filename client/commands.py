"""``facefuse fuse``, ``fuse-video``, ``txt2img`` and ``ui``: call a running deployment."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from facefuse.client.api import DEFAULT_URLS, PROTOCOLS


def _common(parser: argparse.ArgumentParser, with_strength: bool) -> None:
    parser.add_argument("-o", "--output", type=Path, required=True, help="where to write the PNG")
    parser.add_argument(
        "--protocol", choices=PROTOCOLS, default="grpc", help="gRPC (default) or HTTP"
    )
    parser.add_argument(
        "--url",
        default=None,
        help=f"server address host:port (default {DEFAULT_URLS['grpc']} for gRPC, "
        f"{DEFAULT_URLS['http']} for HTTP)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="denoising steps, 1..100 (default: the served default_steps, 10 for fusion)",
    )
    if with_strength:
        parser.add_argument(
            "--strength",
            type=float,
            default=None,
            help="how much of the face is re-generated, 0.05..1 (server default_strength: 0.8)",
        )
    parser.add_argument(
        "--guidance",
        type=float,
        default=None,
        help="classifier-free guidance scale, 1..30 (default 7.5)",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="random seed; same seed, same image (default 0)"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="request timeout in seconds (default 600)"
    )
    parser.add_argument("--info", action="store_true", help="print the server's INFO JSON")
    parser.add_argument(
        "--template-key",
        default=None,
        help="prompt-template name sent as the x-facefuse-template header, so a "
        "consistent-hash proxy routes one template to one replica's prefix cache",
    )


def register(subparsers) -> None:
    fuse = subparsers.add_parser(
        "fuse",
        help="fuse the face of a source photo into a target image",
        description="Send SOURCE's face, TARGET and an instruction to the facefusion model and "
        "write the fused PNG (TARGET's size). Errors print one line and exit non-zero.",
    )
    fuse.add_argument("--source", type=Path, required=True, help="photo with the face to use (A)")
    fuse.add_argument("--target", type=Path, required=True, help="image to put the face into (B)")
    fuse.add_argument(
        "--instruction", required=True, help='what to do, e.g. "make him smile, keep the glasses"'
    )
    fuse.add_argument(
        "--expression-source",
        choices=("target", "source"),
        default=None,
        help="whose expression the answer wears before the edit (server default: target, B's)",
    )
    fuse.add_argument(
        "--smile", type=float, default=None, help="expression edit: smile -1..2 (overrides words)"
    )
    fuse.add_argument(
        "--mouth-open", type=float, default=None, help="expression edit: mouth open 0..1"
    )
    fuse.add_argument(
        "--face-select",
        choices=("largest", "all", "reference"),
        default=None,
        help="which faces of TARGET to fuse (server default: largest)",
    )
    fuse.add_argument(
        "--reference-face", type=Path, default=None, help="photo for --face-select reference"
    )
    _common(fuse, with_strength=True)
    fuse.set_defaults(func=run_fuse)
    txt = subparsers.add_parser(
        "txt2img",
        help="generate a portrait from a prompt",
        description="Send a prompt to the txt2img model and write the PNG.",
    )
    txt.add_argument("--prompt", required=True, help="the portrait description")
    _common(txt, with_strength=False)
    txt.set_defaults(func=run_txt2img)
    register_video(subparsers)
    register_ui(subparsers)


def register_video(subparsers) -> None:
    video = subparsers.add_parser(
        "fuse-video",
        help="fuse a face into every frame of a video (or a live, camera-paced stream)",
        description="Decode TARGET with PyAV, fuse SOURCE's face into each frame through the "
        "facefusion_stream model (gRPC streaming), and write OUTPUT with TARGET's frame count, "
        "rate, timestamps, size and rotation, its audio copied packet for packet. H.264 in "
        ".mp4/.mov/.mkv, VP9 in .webm. An interrupted run leaves no OUTPUT.",
    )
    video.add_argument("--source", type=Path, required=True, help="photo with the face (A)")
    video.add_argument("--target", type=Path, required=True, help="the video (B)")
    video.add_argument("-o", "--output", type=Path, required=True, help="the fused video")
    video.add_argument("--instruction", default="", help="what to do (default none: a plain swap)")
    video.add_argument("--url", default=None, help=f"gRPC address (default {DEFAULT_URLS['grpc']})")
    video.add_argument(
        "--protocol", choices=("grpc",), default="grpc", help="streams need gRPC streaming"
    )
    video.add_argument("--expression-source", choices=("target", "source"), default=None)
    video.add_argument("--smile", type=float, default=None, help="smile edit -1..2")
    video.add_argument("--mouth-open", type=float, default=None, help="mouth-open edit 0..1")
    video.add_argument("--face-select", choices=("largest", "all"), default=None)
    video.add_argument("--steps", type=int, default=None, help="key frames' denoising steps")
    video.add_argument("--strength", type=float, default=None, help="key frames' strength")
    video.add_argument("--guidance", type=float, default=None)
    video.add_argument(
        "--live",
        action="store_true",
        help="send frames at the clip's own rate, as a camera would; the service drops what it "
        "cannot serve in time (a dropped frame repeats the last fused one in OUTPUT)",
    )
    video.add_argument(
        "--stats", type=Path, default=None, help="write per-frame latency and drops as JSON"
    )
    video.add_argument(
        "--transport", choices=("raw", "jpeg"), default="raw",
        help="frames as raw RGB tensors (default) or JPEG (a tenth of the bytes)",
    )  # fmt: skip
    video.add_argument("--max-in-flight", type=int, default=4, help="frames unanswered at once")
    video.add_argument(
        "--parallel", type=int, default=1, metavar="N",
        help="split the clip at keyframes into N segments fused over N streams at once (N "
        "replicas behind --url fuse it up to N times faster); not with --live",
    )  # fmt: skip
    video.add_argument("--timeout", type=float, default=120.0, help="seconds without an answer")
    video.add_argument("--no-progress", action="store_true", help="no progress bar")
    video.set_defaults(func=run_fuse_video)


def run_fuse_video(args: argparse.Namespace) -> int:
    from facefuse.client.api import read_image
    from facefuse.client.video_job import fuse_video

    source = read_image(args.source, "--source")
    options = {
        "steps": args.steps,
        "strength": args.strength,
        "guidance": args.guidance,
        "expression_source": args.expression_source,
        "expression_smile": args.smile,
        "expression_mouth_open": args.mouth_open,
        "face_select": args.face_select,
    }
    report = fuse_video(
        args.url or DEFAULT_URLS["grpc"], source, args.target, args.output, args.instruction,
        live=args.live, transport=args.transport, max_in_flight=args.max_in_flight,
        timeout_s=args.timeout, progress=not args.no_progress, parallel=args.parallel, **options,
    )  # fmt: skip
    summary = report["summary"]
    print(
        f"wrote {args.output}: {summary['frames']} frames, {summary['delivered']} fused, "
        f"{summary['dropped']} dropped, {summary['fps']:.1f} frames/s "
        f"({summary['x_real_time']:.2f}x real time), latency p50 {summary['latency_ms_p50']:.0f} ms"
    )
    if args.stats is not None:
        args.stats.parent.mkdir(parents=True, exist_ok=True)
        args.stats.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def _params(args, with_strength: bool) -> dict:
    params = {
        "steps": args.steps,
        "guidance": args.guidance,
        "seed": args.seed,
        "template_key": args.template_key,
    }
    if with_strength:
        params["strength"] = args.strength
    return params


def _finish(args, result) -> int:
    path = result.save(args.output)
    print(f"wrote {path} ({len(result.png)} bytes)")
    if args.info:
        print(json.dumps(result.info, indent=2, sort_keys=True))
    return 0


def run_fuse(args: argparse.Namespace) -> int:
    from facefuse.client.api import Client

    with Client(args.url, args.protocol, args.timeout) as client:
        result = client.fuse(
            args.source,
            args.target,
            args.instruction,
            expression_source=args.expression_source,
            expression_smile=args.smile,
            expression_mouth_open=args.mouth_open,
            face_select=args.face_select,
            reference_face=args.reference_face,
            **_params(args, with_strength=True),
        )
    return _finish(args, result)


def run_txt2img(args: argparse.Namespace) -> int:
    from facefuse.client.api import Client

    with Client(args.url, args.protocol, args.timeout) as client:
        result = client.txt2img(args.prompt, **_params(args, with_strength=False))
    return _finish(args, result)


def register_ui(subparsers) -> None:
    ui = subparsers.add_parser(
        "ui",
        help="open a local web page to try fusion on photos, videos and the camera",
        description="A Gradio page (install facefuse[ui]) that talks to a running Triton server "
        "through this client library: photos, videos with sound, the camera live, txt2img. "
        "Binds 127.0.0.1 unless --host and --allow-remote say otherwise.",
    )
    ui.add_argument("--url", default=None, help=f"gRPC address (default {DEFAULT_URLS['grpc']})")
    ui.add_argument(
        "--repository", type=Path, default=None,
        help="start a local tritonserver on this exported repository for the page (stopped "
        "with it) instead of using --url",
    )  # fmt: skip
    ui.add_argument("--host", default="127.0.0.1", help="address the page binds (loopback)")
    ui.add_argument("--port", type=int, default=7860, help="the page's port (default 7860)")
    ui.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --host")
    ui.add_argument(
        "--token", default=os.environ.get("FACEFUSE_UI_TOKEN"),
        help="ask for this token before the page opens (default: $FACEFUSE_UI_TOKEN, or none)",
    )  # fmt: skip
    ui.add_argument("--max-file-mb", type=int, default=200, help="largest upload, MB")
    ui.set_defaults(func=run_ui)


def run_ui(args: argparse.Namespace) -> int:
    try:
        from facefuse.client.ui import serve
    except ModuleNotFoundError as exc:  # the optional extra is not installed
        print(f"facefuse ui needs the ui extra ({exc.name} is missing): "
              "pip install 'facefuse[ui]' (or make ui)", file=sys.stderr)  # fmt: skip
        return 2
    if args.token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print("facefuse ui: warning: a page on a non-loopback address without --token",
              file=sys.stderr)  # fmt: skip
    with contextlib.ExitStack() as stack:
        url = args.url or DEFAULT_URLS["grpc"]
        if args.repository is not None:
            from facefuse.serving.server import LocalTritonServer, ServerConfig

            print(f"starting tritonserver on {args.repository} ...", flush=True)
            server = stack.enter_context(LocalTritonServer(ServerConfig(args.repository)))
            url = server.grpc_url
        print(f"facefuse ui on http://{args.host}:{args.port}/ (server {url}); Ctrl-C stops it",
              flush=True)  # fmt: skip
        serve(url, args.host, args.port, args.token, args.allow_remote, args.max_file_mb)
    return 0
