"""``facefuse fuse`` and ``facefuse txt2img``: call a running deployment."""

from __future__ import annotations

import argparse
import json
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
