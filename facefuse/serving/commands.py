"""``facefuse serve``: run the local Triton server on a model repository until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
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
    add_supervisor_arguments(parser)
    parser.set_defaults(func=run)


def add_supervisor_arguments(parser) -> None:
    """--no-supervisor, --health-port and one flag per supervisor setting (issue 33)."""
    from dataclasses import fields

    from facefuse.serving.supervisor import (
        DEFAULT_HEALTH_PORT,
        HELP,
        RANGES,
        SupervisorSettings,
        flag_name,
    )

    group = parser.add_argument_group(
        "self-healing",
        "The supervisor watches every Python-backend model process and reloads a dead or hung "
        "model through the model-repository API (the server runs with explicit model control); "
        "its /ready, /live, /metrics and /status answer on --health-port.",
    )
    group.add_argument(
        "--no-supervisor",
        action="store_true",
        help="do not watch or reload models (then a dead model process stays dead until restart)",
    )
    group.add_argument(
        "--health-port",
        type=int,
        default=DEFAULT_HEALTH_PORT,
        help=f"port of the supervisor's /ready /live /metrics (default {DEFAULT_HEALTH_PORT}; "
        "0 = any free port)",
    )
    defaults = SupervisorSettings()
    for f in fields(SupervisorSettings):
        default = getattr(defaults, f.name)
        if f.name == "exit_on_give_up":
            group.add_argument(
                flag_name(f.name),
                dest=f"supervisor_{f.name}",
                default=None,
                metavar="BOOL",
                help="exit (code 3) once a model is given up, so that a process manager "
                "restarts everything (default false)",
            )
            continue
        low, high = RANGES[f.name]
        group.add_argument(
            flag_name(f.name),
            dest=f"supervisor_{f.name}",
            default=None,
            metavar="N",
            help=f"{HELP[f.name]} (default {default:g}; {low:g}..{high:g})",
        )


def supervisor_settings(args: argparse.Namespace):
    """The checked settings from the flags (a SettingError names the bad one)."""
    from dataclasses import fields

    from facefuse.serving.supervisor import SupervisorSettings

    values = {
        f.name: getattr(args, f"supervisor_{f.name}")
        for f in fields(SupervisorSettings)
        if getattr(args, f"supervisor_{f.name}", None) is not None
    }
    return SupervisorSettings.from_strings(values)


def run(args: argparse.Namespace) -> int:
    from facefuse.serving.server import (
        ADMIN_HEADER,
        GRPC_ADMIN_HEADER,
        LocalTritonServer,
        ServerConfig,
    )
    from facefuse.serving.supervisor import SettingError, Supervision, check_port

    # refuse a bad setting before anything starts
    try:
        settings = None if args.no_supervisor else supervisor_settings(args)
        check_port(args.health_port)
    except SettingError as exc:
        print(f"facefuse serve: error: {exc}", file=sys.stderr)
        return 2
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
        model_control_explicit=settings is not None,
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
        supervision = None
        if settings is not None:
            supervision = Supervision(
                server.http_url,
                server.process.pid,
                config.admin_key if config.restrict_apis else None,
                settings,
                health_host=config.host,
                health_port=args.health_port,
            ).start()
            print(
                f"supervisor: {supervision.health_url}/ready /live /metrics /status "
                "(dead or hung model processes are reloaded)"
            )
        print("Ctrl-C to stop", flush=True)
        try:
            while not stop.wait(0.5):
                if server.process.poll() is not None:
                    print(f"tritonserver exited with code {server.process.returncode}")
                    return 1
                if supervision is not None and supervision.exit_code == 3:
                    print("supervisor gave up on a model (--supervisor-exit-on-give-up): exiting")
                    return 3
        except KeyboardInterrupt:
            pass
        finally:
            if supervision is not None:
                supervision.stop()
        print("stopping ...", flush=True)
    return 0
