"""Start and stop a local ``tritonserver`` (the binary inside the ``nvidia-pytriton`` wheel).

:class:`LocalTritonServer` is a context manager: it picks free loopback ports, starts the
server on a model repository, waits for ``/v2/health/ready`` and stops it on exit (SIGINT,
then SIGKILL after a grace period). The model-repository, shared-memory, trace and logging
APIs are restricted by default to callers that send the admin key header
(``facefuse.serving.tritonserver_args`` builds the command line).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from facefuse.core.errors import FacefuseError
from facefuse.serving.tritonserver_args import (  # noqa: F401 - re-exported for callers
    ADMIN_HEADER,
    GRPC_ADMIN_HEADER,
    RESTRICTED_APIS,
    ServerArgs,
    tritonserver_command,
)


class ServerError(FacefuseError, RuntimeError):
    """tritonserver could not be found, started or made ready."""


@dataclass(frozen=True)
class TritonPaths:
    """Where the server binary, its backends and the Python-backend stub live."""

    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.root / "backends"

    @classmethod
    def find(cls) -> TritonPaths:
        try:
            import pytriton
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ServerError(
                "nvidia-pytriton is not installed: pip install nvidia-pytriton"
            ) from exc
        paths = cls(Path(pytriton.__file__).parent / "tritonserver")
        if not paths.binary.exists():
            raise ServerError(f"tritonserver binary not found at {paths.binary}")
        paths.install_stub()
        return paths

    def install_stub(self) -> None:
        """Copy the Python-backend stub for this interpreter where its RPATH expects it."""
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        target = self.backends / "python" / "triton_python_backend_stub"
        if target.exists():
            return
        source = self.root / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not source.exists():
            raise ServerError(f"no Python-backend stub for Python {version} in {source.parent}")
        shutil.copy2(source, target)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServerConfig:
    """How to run the server. Ports of 0 are replaced by free ports at start."""

    repository: Path
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    model_config_name: str | None = "cpu"
    admin_key: str | None = None  # None: a random key, printed at start
    restrict_apis: bool = True
    log_verbose: int = 0
    # --model-control-mode=explicit --load-model=*: the supervisor reloads a dead model
    model_control_explicit: bool = False
    ready_timeout_s: float = 300.0
    extra_args: list[str] = field(default_factory=list)
    # a checkout whose packages the model stubs import first, e.g. an older build
    # (:func:`stub_python_first`)
    python_path: Path | None = None

    def __post_init__(self) -> None:
        self.repository = Path(self.repository)
        if not self.repository.is_dir():
            raise ServerError(f"--repository {self.repository}: not a directory")
        if self.host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):  # noqa: S104
            raise ServerError(f"--host {self.host}: expected 127.0.0.1 (default) or 0.0.0.0")
        for name in ("http_port", "grpc_port", "metrics_port"):
            port = getattr(self, name)
            if not (0 <= port < 65536):
                raise ServerError(f"--{name.replace('_', '-')} {port}: expected 0..65535")
            if port == 0:
                setattr(self, name, free_port())
        if self.admin_key is None:
            self.admin_key = secrets.token_hex(16)


def stub_python_first(checkout: Path) -> Path:
    """A venv (made once, ``checkout/.facefuse-stub-venv``) whose ``sys.path`` starts with
    ``checkout`` and goes on with this interpreter's site-packages; returns its folder. (The
    server is also started in ``checkout``: the stubs import from their working directory.)

    The Python-backend stub embeds libpython in isolated mode (PYTHONPATH is ignored) and takes
    its prefix from the first ``python3`` on PATH (docs/gpu.md), so a stub started with this
    venv's ``bin`` first imports ``checkout``'s packages before this environment's (an
    editable install's finder comes after every ``sys.path`` entry)."""
    import site

    checkout = checkout.resolve()
    venv = checkout / ".facefuse-stub-venv"
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    pth = venv / "lib" / version / "site-packages" / "zz_facefuse_first.pth"
    lines = [str(checkout)] + [
        f"import site; site.addsitedir({d!r})" for d in site.getsitepackages()
    ]
    if not pth.is_file() or pth.read_text().splitlines() != lines:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        pth.write_text("\n".join(lines) + "\n")
    return venv


class LocalTritonServer:
    """A tritonserver process on a repository; use ``with LocalTritonServer(config) as s:``."""

    def __init__(self, config: ServerConfig, log_path: Path | None = None):
        self.config = config
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self._log_file = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.config.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.config.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.config.metrics_port}/metrics"

    def command(self, paths: TritonPaths) -> list[str]:
        c = self.config
        return tritonserver_command(
            ServerArgs(
                binary=str(paths.binary),
                repository=str(c.repository.resolve()),
                backend_directory=str(paths.backends),
                host=c.host,
                http_port=c.http_port,
                grpc_port=c.grpc_port,
                metrics_port=c.metrics_port,
                model_config_name=c.model_config_name,
                admin_key=c.admin_key if c.restrict_apis else None,
                exit_timeout_s=10,
                log_verbose=c.log_verbose,
                model_control_explicit=c.model_control_explicit,
                extra=tuple(c.extra_args),
            )
        )

    def environment(self) -> dict[str, str]:
        """The stub must embed the same libpython as this interpreter (see triton-on-cpu.md)."""
        env = dict(os.environ)
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, env.get("LD_LIBRARY_PATH")) if p
        )
        env.setdefault("OMP_NUM_THREADS", "1")
        # the stub's interpreter must see this environment's packages (editable install too)
        interpreter = Path(sys.executable).parent
        if self.config.python_path is not None:
            interpreter = stub_python_first(Path(self.config.python_path)) / "bin"
        env["PATH"] = os.pathsep.join((str(interpreter), env.get("PATH", "")))
        return env

    def start(self) -> LocalTritonServer:
        paths = TritonPaths.find()
        out = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "wb")
            out = self._log_file
        # the stubs also import from their working directory: an older checkout's, when given
        where = self.config.python_path
        self.process = subprocess.Popen(
            self.command(paths),
            env=self.environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=None if where is None else Path(where).resolve(),
        )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def is_ready(self) -> bool:
        try:
            url = f"http://{self.http_url}/v2/health/ready"
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(
                    f"tritonserver exited with code {self.process.returncode} before it was ready"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            if self.is_ready():
                return
            time.sleep(0.25)
        raise ServerError(f"tritonserver not ready after {self.config.ready_timeout_s:.0f} s")

    def stop(self, grace_s: float = 30.0) -> None:
        from facefuse.serving.supervisor import remove_orphaned_shm_regions

        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # what a killed server or stub left in /dev/shm (nothing maps it any more)
        remove_orphaned_shm_regions(min_age_s=2.0)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> LocalTritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def served_url(repository: Path, url: str | None, log_path: Path):
    """Yield ``(gRPC URL, where)``: ``url`` itself when given, else the URL of a local
    tritonserver started here on ``repository`` (its log at ``log_path``) and stopped on exit.
    The evaluation commands take the served model either way."""
    if url is not None:
        yield url, url
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"starting tritonserver on {repository} (log: {log_path}) ...", flush=True)
    started = time.perf_counter()
    with LocalTritonServer(ServerConfig(repository=repository), log_path=log_path) as server:
        print(f"ready in {time.perf_counter() - started:.1f} s", flush=True)
        yield server.grpc_url, f"local tritonserver on {repository}"
