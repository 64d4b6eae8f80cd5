"""``facefuse demo``: the embedded default end to end, on photos that ship in installed wheels.

Starts a local tritonserver on free loopback ports, fuses Grace Hopper's face (matplotlib's
sample photo) into scikit-image's astronaut photo over gRPC, writes the PNG and stops the server.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="start a local server, fuse two bundled faces, write a PNG, stop the server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--repository",
        type=Path,
        default=Path("model_repository"),
        help="exported model repository (run `facefuse export` first; default model_repository)",
    )
    parser.add_argument("--out", type=Path, default=Path("out/fused.png"), help="PNG to write")
    parser.add_argument(
        "--instruction",
        default="make her smile, keep the hair, soft studio light",
        help="the instruction sent with the images",
    )
    parser.add_argument(
        "--log", type=Path, default=Path("out/tritonserver.log"), help="server log file"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from facefuse.client import Client
    from facefuse.core.samples import sample_pair, write_samples
    from facefuse.serving.server import LocalTritonServer, ServerConfig

    source_path, target_path = write_samples(args.out.parent / "samples")
    started = time.perf_counter()
    print(f"starting tritonserver on {args.repository} (log: {args.log}) ...", flush=True)
    with LocalTritonServer(ServerConfig(repository=args.repository), log_path=args.log) as server:
        ready = time.perf_counter() - started
        print(f"ready in {ready:.1f} s: gRPC {server.grpc_url}, HTTP {server.http_url}", flush=True)
        source, target = sample_pair()
        with Client(server.grpc_url, "grpc") as client:
            request_started = time.perf_counter()
            result = client.fuse(source, target, args.instruction)
            request_s = time.perf_counter() - request_started
        result.save(args.out)
    print(f"source {source_path}, target {target_path}")
    print(f"wrote {args.out} ({len(result.png)} bytes); request took {request_s:.2f} s")
    print(json.dumps(result.info, indent=2, sort_keys=True))
    print(f"demo total (server start + request + stop): {time.perf_counter() - started:.1f} s")
    return 0
