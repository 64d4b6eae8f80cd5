"""``facefuse serve``: run the local Triton server on a model repository until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="start a local tritonserver on a model repository",
        description=(
            "Start the tritonserver binary shipped in the nvidia-pytriton wheel on a model "
            "repository, wait until every model is ready, print the endpoints and serve until "
            "Ctrl-C (then shut down cleanly). Loopback only unless --public is given; the "
            "model-repository and shared-memory APIs need the admin key header."
        ),
    )
    parser.add_argument(
        "--repository",
        type=Path,
        default=Path("model_repository"),
        help="model repository (default: model_repository; run `facefuse export` first)",
    )
    parser.add_argument(
        "--http-port", type=int, default=8000, help="HTTP port (default 8000; 0 = any free port)"
    )
    parser.add_argument(
        "--grpc-port", type=int, default=8001, help="gRPC port (default 8001; 0 = any free port)"
    )
    parser.add_argument(
        "--metrics-port", type=int, default=8002, help="Prometheus metrics port (default 8002)"
    )
    parser.add_argument(
        "--config",
        default="cpu",
        choices=("cpu", "gpu"),
        help="model configuration variant: configs/<name>.pbtxt where a model has one, "
        "else config.pbtxt (default cpu)",
    )
    parser.add_argument(
        "--public",
        action="store_true",
        help="listen on all interfaces (0.0.0.0) instead of 127.0.0.1; put it behind TLS and auth",
    )
    parser.add_argument(
        "--admin-key",
        default=None,
        help="value of the 'facefuse-admin-key' header that unlocks the model-repository and "
        "shared-memory APIs (default: a random key printed at start)",
    )
    parser.add_argument(
        "--unrestricted",
        action="store_true",
        help="do not restrict the model-repository and shared-memory APIs (not recommended)",
    )
    parser.add_argument("--log", type=Path, default=None, help="write the server log to this file")
    parser.add_argument(
        "--log-verbose", type=int, default=0, help="tritonserver --log-verbose level"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from facefuse.serving.server import (
        ADMIN_HEADER,
        GRPC_ADMIN_HEADER,
        LocalTritonServer,
        ServerConfig,
    )

    config = ServerConfig(
        repository=args.repository,
        host="0.0.0.0" if args.public else "127.0.0.1",  # noqa: S104 - explicit opt-in
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        model_config_name=args.config,
        admin_key=args.admin_key,
        restrict_apis=not args.unrestricted,
        log_verbose=args.log_verbose,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"starting tritonserver on {args.repository} ...", flush=True)
    with LocalTritonServer(config, log_path=args.log) as server:
        print(
            f"ready: HTTP {server.http_url}  gRPC {server.grpc_url}  metrics {server.metrics_url}"
        )
        if config.restrict_apis:
            print(
                f"admin APIs need the key {config.admin_key} in header {ADMIN_HEADER} (HTTP) "
                f"or metadata {GRPC_ADMIN_HEADER} (gRPC)"
            )
        print("Ctrl-C to stop", flush=True)
        try:
            while not stop.wait(0.5):
                if server.process.poll() is not None:
                    print(f"tritonserver exited with code {server.process.returncode}")
                    return 1
        except KeyboardInterrupt:
            pass
        print("stopping ...", flush=True)
    return 0
