"""The one tritonserver command line: ``facefuse serve``, ``facefuse demo``, the test fixtures,
the benches and ``docker/entrypoint.py`` all build it here.

Standard library only: the container entrypoint imports it before anything else is known
about the environment.
"""

from __future__ import annotations

from dataclasses import dataclass

ADMIN_HEADER = "facefuse-admin-key"
# gRPC clients send the key under this name: Triton prefixes restricted-protocol headers
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"
# APIs that need the admin key: the model-repository and shared-memory APIs change what the
# server runs and reads; the trace and logging update calls change files and verbosity.
RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")


def restriction(key: str) -> str:
    """The value of ``--http-restricted-api`` and ``--grpc-restricted-protocol``."""
    return f"{','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={key}"


@dataclass(frozen=True)
class ServerArgs:
    """What varies between the places that start a server; everything else is fixed here."""

    binary: str
    repository: str
    http_port: int
    grpc_port: int
    metrics_port: int
    admin_key: str | None  # None: no API is restricted (an explicit opt-out)
    host: str | None = None  # None: the server's default (all interfaces, in a container)
    model_config_name: str | None = None
    backend_directory: str | None = None
    cpu_only: bool = True  # no pinned or CUDA memory pools, no GPU metrics
    model_control_none: bool = False  # no load/unload over the network, whatever the key
    # load every model at start and allow unload/load through the (key-restricted)
    # model-repository API: what the supervisor (facefuse.serving.supervisor) reloads with
    model_control_explicit: bool = False
    exit_timeout_s: int | None = None
    log_verbose: int | None = None
    extra: tuple[str, ...] = ()


def tritonserver_command(a: ServerArgs) -> list[str]:
    """argv of tritonserver for ``a`` (``a.binary`` first)."""
    args = [a.binary, f"--model-repository={a.repository}"]
    if a.backend_directory:
        args.append(f"--backend-directory={a.backend_directory}")
    if a.host is not None:
        args += [f"--{api}-address={a.host}" for api in ("http", "grpc", "metrics")]
    args += [
        f"--http-port={a.http_port}",
        f"--grpc-port={a.grpc_port}",
        f"--metrics-port={a.metrics_port}",
    ]
    if a.model_config_name:
        args.append(f"--model-config-name={a.model_config_name}")
    if a.model_control_none and a.model_control_explicit:
        raise ValueError("model_control_none and model_control_explicit exclude each other")
    if a.model_control_none:
        args.append("--model-control-mode=none")
    if a.model_control_explicit:
        args += ["--model-control-mode=explicit", "--load-model=*"]
    args += [
        "--strict-readiness=true",
        "--exit-on-error=true",
        "--metrics-config=summary_latencies=true",  # p50/p95 for the dashboard and alerts
    ]
    if a.exit_timeout_s is not None:
        args.append(f"--exit-timeout-secs={a.exit_timeout_s}")
    if a.log_verbose is not None:
        args.append(f"--log-verbose={a.log_verbose}")
    if a.cpu_only:
        args += [
            "--pinned-memory-pool-byte-size=0",
            "--cuda-memory-pool-byte-size=0:0",
            "--allow-gpu-metrics=false",
        ]
    if a.admin_key is not None:
        args += [
            f"--http-restricted-api={restriction(a.admin_key)}",
            f"--grpc-restricted-protocol={restriction(a.admin_key)}",
        ]
    return args + list(a.extra)
