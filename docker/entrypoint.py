#!/usr/bin/env python3
"""Container entrypoint for facefuse images: build GPU engines once, then exec tritonserver.

Standard library plus ``facefuse.serving.tritonserver_args`` (itself standard library only; the
images install facefuse), so that the same file runs in the NGC Triton image (system Python
3.10) and in the CPU image (Python 3.11 venv). Sub-commands:

``serve`` (default)
    Resolve the model repository, build TensorRT engines first if the GPU variant needs them
    and the cache holds none for this GPU + TensorRT version, then run ``tritonserver`` under
    the supervisor (SIGTERM and SIGINT are passed on to it; the exit code is the server's, or
    3 when the supervisor gave up on a model). With ``FACEFUSE_SUPERVISOR=0`` this process is
    replaced by ``tritonserver`` instead.
``build-engines``
    Only the engine step, then exit 0: warms the cache before a rollout (no admin key needed).
``healthcheck``
    Exit 0 when the supervisor's ``/ready`` (or, without the supervisor, Triton's
    ``/v2/health/ready``) answers 200 (Docker ``HEALTHCHECK``).
``print-command``
    Print the tritonserver command line as JSON (the admin key masked) and exit: for debugging
    and for the offline tests.

Environment (every name is read here and nowhere else):

==============================  ===============================================================
``FACEFUSE_MODEL_CONFIG``       ``cpu`` or ``gpu``: passed as ``--model-config-name``
``FACEFUSE_MODEL_REPOSITORY``   a local folder or ``s3://...`` (default: the image's copy)
``FACEFUSE_ENGINE_CACHE``       writable volume for built GPU repositories (``/engine-cache``)
``FACEFUSE_MODEL``              ``tiny`` or a mounted checkpoint folder, for the engine build
``FACEFUSE_PRECISION``          engine precision for ``facefuse export``; default ``fp16``
``FACEFUSE_ADMIN_KEY``          value of the ``facefuse-admin-key`` header for restricted APIs
``FACEFUSE_ADMIN_KEY_FILE``     alternative: a file holding the key (a mounted Secret)
``TRITONSERVER_BIN``            the server binary; default ``/opt/tritonserver/bin/tritonserver``
``TRITON_BACKEND_DIR``          ``--backend-directory`` when not the binary's default
``FACEFUSE_NVINFER_DIRS``       where to look for ``libnvinfer.so.X.Y.Z`` (the runtime TensorRT)
``FACEFUSE_SUPERVISOR``         ``1`` (default): run tritonserver as a child with the supervisor
                                (``facefuse.serving.supervisor``): dead or hung model processes
                                are reloaded, ``/ready`` ``/live`` ``/metrics`` answer on
                                ``FACEFUSE_HEALTH_PORT``; ``0``: exec tritonserver as before
                                (model control ``none``, no self-healing)
``FACEFUSE_HEALTH_PORT``        the supervisor's port (default 8003; the Kubernetes probes)
``FACEFUSE_SUPERVISOR_<NAME>``  a supervisor setting, e.g. ``..._PROBE_TIMEOUT_S=20``; the
                                container default of ``EXIT_ON_GIVE_UP`` is ``1`` (exit code 3
                                so that the orchestrator restarts the container)
==============================  ===============================================================

The engine cache key is ``<gpu-name>-sm<compute-capability>-trt<version>-<digest>``: TensorRT
engines only load on the GPU model and TensorRT version that built them (server issue #7613),
and the digest covers the repository sources, the model and the precision, so a new image
with other configs builds into a new key instead of serving a stale engine.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from facefuse.serving.supervisor import (  # standard library only too
    DEFAULT_HEALTH_PORT,
    SettingError,
    Supervision,
    SupervisorSettings,
    check_port,
)

# standard library only too; the one builder of the command line, shared with `facefuse serve`
from facefuse.serving.tritonserver_args import (  # noqa: F401 - ADMIN_HEADER re-exported
    ADMIN_HEADER,
    RESTRICTED_APIS,
    ServerArgs,
    tritonserver_command,
)

MIN_KEY_CHARS = 16
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
DEFAULT_REPOSITORY = "/opt/facefuse/model_repository"
DEFAULT_CACHE = "/engine-cache"
DEFAULT_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
DEFAULT_NVINFER_DIRS = "/usr/lib/x86_64-linux-gnu:/usr/local/tensorrt/lib"
COMPLETE_MARKER = ".complete.json"
TENSORRT_CONFIG = re.compile(r'^\s*(platform\s*:\s*"tensorrt_plan"|backend\s*:\s*"tensorrt")', re.M)
NVINFER = re.compile(r"^libnvinfer\.so\.(\d+\.\d+\.\d+)$")


class EntrypointError(RuntimeError):
    """A start-up condition the operator must fix; printed as one line, exit code 2."""


@dataclass(frozen=True)
class Settings:
    model_config: str
    repository: str
    engine_cache: Path
    model: str
    precision: str
    admin_key: str
    tritonserver: str
    backend_dir: str | None
    nvinfer_dirs: tuple[Path, ...]
    supervisor: SupervisorSettings | None = None  # None: FACEFUSE_SUPERVISOR=0
    health_port: int = DEFAULT_HEALTH_PORT

    @classmethod
    def from_env(cls, env: dict[str, str], need_key: bool = True) -> Settings:
        model_config = env.get("FACEFUSE_MODEL_CONFIG", "")
        if model_config not in ("cpu", "gpu"):
            raise EntrypointError(f"FACEFUSE_MODEL_CONFIG must be cpu or gpu, got {model_config!r}")
        return cls(
            model_config=model_config,
            repository=env.get("FACEFUSE_MODEL_REPOSITORY", DEFAULT_REPOSITORY),
            engine_cache=Path(env.get("FACEFUSE_ENGINE_CACHE", DEFAULT_CACHE)),
            model=env.get("FACEFUSE_MODEL", "tiny"),
            precision=env.get("FACEFUSE_PRECISION", "fp16"),
            admin_key=read_admin_key(env) if need_key else "",
            tritonserver=env.get("TRITONSERVER_BIN", DEFAULT_TRITONSERVER),
            backend_dir=env.get("TRITON_BACKEND_DIR") or None,
            nvinfer_dirs=tuple(
                Path(p)
                for p in env.get("FACEFUSE_NVINFER_DIRS", DEFAULT_NVINFER_DIRS).split(":")
                if p
            ),
            supervisor=supervisor_settings(env),
            health_port=health_port(env),
        )

    @property
    def is_s3(self) -> bool:
        return self.repository.startswith("s3://")


def supervisor_settings(env: dict[str, str]) -> SupervisorSettings | None:
    """FACEFUSE_SUPERVISOR and FACEFUSE_SUPERVISOR_<NAME>, checked (the error names one)."""
    enabled = env.get("FACEFUSE_SUPERVISOR", "1")
    if enabled not in ("0", "1"):
        raise EntrypointError(f"FACEFUSE_SUPERVISOR must be 0 or 1, got {enabled!r}")
    if enabled == "0":
        return None
    try:
        # in a container, giving up means exiting: the orchestrator restarts it
        return SupervisorSettings.from_env(env, exit_on_give_up="1")
    except SettingError as exc:
        raise EntrypointError(str(exc)) from None


def health_port(env: dict[str, str]) -> int:
    raw = env.get("FACEFUSE_HEALTH_PORT", str(DEFAULT_HEALTH_PORT))
    try:
        return check_port(int(raw), "FACEFUSE_HEALTH_PORT")
    except (ValueError, SettingError):
        raise EntrypointError(
            f"FACEFUSE_HEALTH_PORT must be a port in 1..65535, got {raw!r}"
        ) from None


def read_admin_key(env: dict[str, str]) -> str:
    """The admin key from FACEFUSE_ADMIN_KEY or FACEFUSE_ADMIN_KEY_FILE; refuse a weak one."""
    key = env.get("FACEFUSE_ADMIN_KEY", "")
    key_file = env.get("FACEFUSE_ADMIN_KEY_FILE", "")
    if key and key_file:
        raise EntrypointError("set FACEFUSE_ADMIN_KEY or FACEFUSE_ADMIN_KEY_FILE, not both")
    if key_file:
        try:
            key = Path(key_file).read_text().strip()
        except OSError as exc:
            raise EntrypointError(f"FACEFUSE_ADMIN_KEY_FILE {key_file}: {exc.strerror}") from exc
    if len(key) < MIN_KEY_CHARS:
        raise EntrypointError(
            f"the admin key (FACEFUSE_ADMIN_KEY or FACEFUSE_ADMIN_KEY_FILE) must have at least "
            f"{MIN_KEY_CHARS} characters; generate one with: openssl rand -hex 32"
        )
    if not re.fullmatch(r"[A-Za-z0-9_.~+/-]+", key):
        raise EntrypointError(
            "the admin key may only hold letters, digits and _.~+/- (a header value)"
        )
    return key


# --- GPU engines ---------------------------------------------------------------------------


def tensorrt_models(repository: Path, config_name: str = "gpu") -> list[str]:
    """Models whose ``configs/<config_name>.pbtxt`` serves a TensorRT plan."""
    names = []
    for config in sorted(repository.glob(f"*/configs/{config_name}.pbtxt")):
        if TENSORRT_CONFIG.search(config.read_text()):
            names.append(config.parent.parent.name)
    return names


def gpu_identity(env: dict[str, str]) -> tuple[str, str]:
    """(name, compute capability) of the visible GPUs; refuse a mix of models."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],  # noqa: S607
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
            env=env,
        ).stdout
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise EntrypointError(
            f"nvidia-smi failed ({exc}): is a GPU allocated to this container?"
        ) from exc
    gpus = {
        tuple(part.strip() for part in line.split(",", 1))
        for line in out.splitlines()
        if line.strip()
    }
    if not gpus:
        raise EntrypointError("nvidia-smi lists no GPU: is a GPU allocated to this container?")
    if len(gpus) > 1:
        raise EntrypointError(f"GPUs of different models in one container: {sorted(gpus)}")
    name, capability = gpus.pop()
    return name, capability


def runtime_tensorrt_version(dirs: tuple[Path, ...]) -> str | None:
    """X.Y.Z of the ``libnvinfer.so.X.Y.Z`` that Triton's TensorRT backend loads, if found."""
    for folder in dirs:
        if folder.is_dir():
            for entry in sorted(folder.iterdir()):
                match = NVINFER.match(entry.name)
                if match:
                    return match.group(1)
    return None


def builder_tensorrt_version(env: dict[str, str]) -> str:
    """The version of the ``tensorrt`` Python package that ``facefuse export`` builds with."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import tensorrt; print(tensorrt.__version__)"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
            env=env,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise EntrypointError(
            f"cannot import the tensorrt Python package to build engines: {exc}"
        ) from exc
    return out


def same_release(a: str, b: str) -> bool:
    """TensorRT engines need the same major.minor.patch at build and at run time."""
    return a.split(".")[:3] == b.split(".")[:3]


def source_digest(repository: Path, model: str, precision: str) -> str:
    """Hash of what the engines depend on besides the GPU: configs, model code, model, precision."""
    digest = hashlib.sha256(f"{model}\0{precision}\0".encode())
    for path in sorted(repository.rglob("*")):
        if path.is_file() and (
            path.suffix in (".pbtxt", ".py", ".json") or path.name == "model.onnx"
        ):
            digest.update(path.relative_to(repository).as_posix().encode())
            digest.update(str(path.stat().st_size).encode())
            if path.suffix != ".onnx":
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def cache_key(gpu_name: str, capability: str, trt_version: str, digest: str) -> str:
    return f"{slug(gpu_name)}-sm{capability.replace('.', '')}-trt{trt_version}-{digest}"


def build_engines(settings: Settings, env: dict[str, str], log=print) -> Path:
    """Return a repository with engines for this GPU, building it into the cache if needed.

    Concurrent pods on a shared (ReadWriteMany) cache take an exclusive lock per key; the
    build happens in a temporary folder that is renamed into place only when complete, so a
    crash mid-build never leaves a half-written engine that a later start would serve.
    """
    source = Path(settings.repository)
    if not tensorrt_models(source):
        log(f"facefuse: no TensorRT model in {source}/*/configs/gpu.pbtxt; serving it as is")
        return source
    name, capability = gpu_identity(env)
    trt = builder_tensorrt_version(env)
    runtime = runtime_tensorrt_version(settings.nvinfer_dirs)
    if runtime is None:
        raise EntrypointError(
            f"no libnvinfer.so.X.Y.Z in {':'.join(map(str, settings.nvinfer_dirs))}: cannot "
            "check that engines will load (set FACEFUSE_NVINFER_DIRS)"
        )
    if not same_release(trt, runtime):
        raise EntrypointError(
            f"tensorrt Python package {trt} differs from the server's libnvinfer {runtime}: "
            "engines it builds would not load; install tensorrt-cu12 of the server's version"
        )
    key = cache_key(
        name, capability, runtime, source_digest(source, settings.model, settings.precision)
    )
    cache = settings.engine_cache
    final = cache / key
    if (final / COMPLETE_MARKER).exists():
        log(f"facefuse: engine cache hit {final}")
        return final
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = (cache / f"{key}.lock").open("w")
    except OSError as exc:
        raise EntrypointError(
            f"FACEFUSE_ENGINE_CACHE {cache}: not writable ({exc.strerror})"
        ) from exc
    with lock:
        log(f"facefuse: waiting for the build lock of {key}")
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / COMPLETE_MARKER).exists():  # another pod built it while we waited
            log(f"facefuse: engine cache hit {final} (built by another pod)")
            return final
        staging = cache / f".{key}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source, staging, symlinks=True)
        started = time.monotonic()
        log(f"facefuse: building engines for {name} (sm {capability}, TRT {runtime}) in {final}")
        command = [
            shutil.which("facefuse", path=env.get("PATH")) or "facefuse",
            "export",
            "--model",
            settings.model,
            "--out",
            str(staging),
            "--precision",
            settings.precision,
            "--target",
            "gpu",
        ]
        result = subprocess.run(command, cwd=cache, env=env, check=False)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise EntrypointError(
                f"engine build failed: {' '.join(command)} exited {result.returncode}"
            )
        missing = [
            m for m in tensorrt_models(staging) if not (staging / m / "1" / "model.plan").is_file()
        ]
        if missing:
            shutil.rmtree(staging, ignore_errors=True)
            raise EntrypointError(f"engine build wrote no model.plan for: {', '.join(missing)}")
        marker = {
            "gpu": name,
            "compute_capability": capability,
            "tensorrt": runtime,
            "model": settings.model,
            "precision": settings.precision,
            "build_s": round(time.monotonic() - started, 1),
        }
        (staging / COMPLETE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if final.exists():  # an incomplete folder left by an older layout
            shutil.rmtree(final)
        staging.rename(final)
        log(f"facefuse: engines built in {marker['build_s']} s")
        return final


# --- the server command ----------------------------------------------------------------------


def server_command(settings: Settings, repository: str, extra: list[str]) -> list[str]:
    return tritonserver_command(
        ServerArgs(
            binary=settings.tritonserver,
            repository=repository,
            backend_directory=settings.backend_dir,
            http_port=HTTP_PORT,
            grpc_port=GRPC_PORT,
            metrics_port=METRICS_PORT,
            model_config_name=settings.model_config,
            admin_key=settings.admin_key,
            cpu_only=settings.model_config == "cpu",
            # the supervisor reloads dead models through the key-restricted repository API;
            # without it nothing may load or unload models over the network
            model_control_none=settings.supervisor is None,
            model_control_explicit=settings.supervisor is not None,
            extra=tuple(extra),
        )
    )


def prepare(settings: Settings, env: dict[str, str]) -> str:
    """The repository to serve: S3 and CPU as given, GPU local folders with built engines."""
    if settings.is_s3:
        # engines in S3 are built per GPU model by whoever publishes it (docs/deploy.md)
        return settings.repository
    if not Path(settings.repository, ".").is_dir():
        raise EntrypointError(f"FACEFUSE_MODEL_REPOSITORY {settings.repository}: not a directory")
    if settings.model_config == "gpu":
        return str(build_engines(settings, env))
    return settings.repository


def healthcheck(url: str | None = None, env: dict[str, str] | None = None) -> int:
    if url is None:
        env = dict(os.environ if env is None else env)
        url = f"http://127.0.0.1:{HTTP_PORT}/v2/health/ready"
        if env.get("FACEFUSE_SUPERVISOR", "1") != "0":
            port = env.get("FACEFUSE_HEALTH_PORT", str(DEFAULT_HEALTH_PORT))
            url = f"http://127.0.0.1:{port}/ready"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1


def main(argv: list[str] | None = None, env: dict[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    command = argv.pop(0) if argv and not argv[0].startswith("-") else "serve"
    if command == "healthcheck":
        return healthcheck(env=env)
    if command not in ("serve", "build-engines", "print-command"):
        print(f"facefuse-entrypoint: unknown command {command!r}", file=sys.stderr)
        return 2
    try:
        settings = Settings.from_env(env, need_key=command != "build-engines")
        if command == "print-command":
            args = server_command(settings, settings.repository, argv)
            print(json.dumps([a.replace(settings.admin_key, "***") for a in args]))
            return 0
        repository = prepare(settings, env)
        if command == "build-engines":
            return 0
        args = server_command(settings, repository, argv)
    except EntrypointError as exc:
        print(f"facefuse-entrypoint: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    if settings.supervisor is None:
        os.execve(args[0], args, env)  # noqa: S606 - replaces this process, no shell
        return 0  # pragma: no cover - execve does not return
    return supervise(args, env, settings)


def supervise(args: list[str], env: dict[str, str], settings: Settings) -> int:
    """Run tritonserver as a child under the supervisor; pass SIGTERM/SIGINT on to it.

    Returns tritonserver's exit code, or 3 after the supervisor gave up on a model (the server
    is stopped first), so that the orchestrator restarts the container."""
    server = subprocess.Popen(args, env=env)
    supervision = Supervision(
        f"127.0.0.1:{HTTP_PORT}",
        server.pid,
        settings.admin_key,
        settings.supervisor,
        health_host="0.0.0.0",  # noqa: S104 - the kubelet probes the pod IP
        health_port=settings.health_port,
        log=lambda line: print(line, flush=True),
    )
    stopping = []

    def forward(signum, _frame):
        # first the supervisor, so that stubs ending with the server are not "reloaded"
        supervision.stop_event.set()
        stopping.append(signum)
        if server.poll() is None:
            server.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    supervision.start()
    try:
        while True:
            try:
                code = server.wait(timeout=0.5)
                return code if code >= 0 else 128 - code
            except subprocess.TimeoutExpired:
                pass
            if supervision.exit_code == 3 and not stopping:
                print("facefuse-entrypoint: supervisor gave up; stopping tritonserver", flush=True)
                server.send_signal(signal.SIGTERM)
                try:
                    server.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
                return 3
    finally:
        supervision.stop()


if __name__ == "__main__":
    sys.exit(main())
