"""Self-healing for a running tritonserver: find a dead or hung Python-backend model process
and replace it without a person (issue 33).

Triton 2.51 does not restart a ``triton_python_backend_stub`` that died: every request to the
model then fails with ``Stub process '<model>_0_0' is not healthy.`` while
``/v2/health/ready`` keeps answering 200 (docs/reliability.md). The :class:`Supervisor` here

- watches every stub (the children of tritonserver whose command line names the stub binary;
  the model and instance are read from that command line): gone, zombie or stopped (state
  ``T``) counts as a failure;
- sends a cheap health call to each leaf model (a minimal request built from the model's
  config: any answer within ``probe_timeout_s`` is alive; a timeout or "not healthy" is not);
- on a failure takes the model out (its own ``/ready`` answers 503 so load balancers drain the
  replica), SIGKILLs what is left of a stopped or hung stub and loads a fresh copy of the
  model beside the old one through the model-repository API with the admin key (the server
  runs with ``--model-control-mode=explicit``): a load with the model's own config, one
  parameter bumped, which Triton treats as a changed model and swaps in once loaded, so the
  surviving instances of a several-instance model keep serving meanwhile (a plain load of an
  unchanged model is a no-op); where that load is refused, unload and load. The model is put
  back once its new stubs run and it answers; the old copy's stubs are ended
  ``OLD_COPY_GRACE_S`` later (Triton 2.51 never unloads a copy that lost an instance);
- gives up on a model that failed ``max_reloads`` times within ``reload_window_s``: the model
  stays out, readiness stays failed, liveness fails (so an orchestrator restarts the
  container), the log and the metrics say why, and nothing spins;
- logs every event on one line (``facefuse-supervisor: event=... model=...``) and counts it in
  Prometheus metrics served with ``/ready``, ``/live`` and ``/status`` on its own port.

Standard library only: ``docker/entrypoint.py`` imports it in the NGC image's system Python.
The logic takes its process table, Triton API and clock as arguments, so it is unit-testable
without a server (tests/unit/serving/test_supervisor.py); the integration tests drive it
against a real tritonserver (tests/integration/test_self_healing.py).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

STUB = "triton_python_backend_stub"
ADMIN_HEADER = "facefuse-admin-key"  # = tritonserver_args.ADMIN_HEADER (kept import-free)
# the pipelines clients call (the stream model answers streams only): a health call to them
# would be a failed request in the metrics
# that the error-ratio alert reads, so they are watched through their processes only
ENTRY_MODELS = ("facefusion", "facefusion_stream", "txt2img")
DEFAULT_HEALTH_PORT = 8003
PREFIX = "facefuse-supervisor:"

# metric names (facefuse/core/metrics.py lists them for the alert tests)
M_FAILURES = "facefuse_supervisor_failures_total"
M_RELOADS = "facefuse_supervisor_reloads_total"
M_RECOVERY = "facefuse_supervisor_recovery_seconds"
M_MODEL_UP = "facefuse_supervisor_model_up"
M_GAVE_UP = "facefuse_supervisor_gave_up"
M_READY = "facefuse_supervisor_ready"
M_LIVE = "facefuse_supervisor_live"
RECOVERY_BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300)
UNLOAD_GRACE_S = 5.0  # how long a reload waits for the unload before it loads anyway
# the config parameter a replacing load bumps: Triton loads a changed model beside the old one
GENERATION_PARAMETER = "facefuse_generation"
# Triton 2.51 never finishes unloading a copy that had a dead instance, so its surviving stubs
# would live on beside the new copy (3 facefusion stubs: +1.3 GB in the chaos soak). They get
# no new requests and are ended this long after the swap: a fusion takes 1-8 s on 2 busy
# cores, so what was running on them has finished; a rare slower one fails with Triton's
# retryable "not healthy"
OLD_COPY_GRACE_S = 15.0


# The Python backend's shared-memory regions: one per stub, created by tritonserver and mapped
# by both. A server or stub killed with SIGKILL leaves its region behind in /dev/shm, mapped by
# no process (about 30 after one `make test` before this was cleaned up).
SHM_PREFIX = "triton_python_backend_shm_region_"


def orphaned_shm_regions(
    shm_dir: Path = Path("/dev/shm"),  # noqa: S108 - where POSIX shared memory lives
    proc: Path = Path("/proc"),
    min_age_s: float = 10.0,
) -> list[Path]:
    """The Python-backend regions in ``shm_dir`` that no process maps or holds open, older
    than ``min_age_s`` (a region being created is never taken)."""
    regions = {path.name: path for path in shm_dir.glob(SHM_PREFIX + "*")}
    if not regions:
        return []
    used: set[str] = set()
    for entry in proc.glob("[0-9]*"):
        try:
            maps = (entry / "maps").read_text()
        except OSError:
            continue
        used.update(
            line.rsplit("/", 1)[-1].split()[0] for line in maps.splitlines() if SHM_PREFIX in line
        )
        try:
            links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            links = []
        used.update(link.rsplit("/", 1)[-1].split()[0] for link in links if SHM_PREFIX in link)
    now = time.time()
    orphans = []
    for name, path in regions.items():
        try:
            old = now - path.stat().st_mtime >= min_age_s
        except OSError:
            continue
        if name not in used and old:
            orphans.append(path)
    return sorted(orphans)


def remove_orphaned_shm_regions(**kwargs) -> int:
    """Unlink :func:`orphaned_shm_regions`; returns how many were removed."""
    removed = 0
    for path in orphaned_shm_regions(**kwargs):
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed


class SettingError(ValueError):
    """A supervisor setting out of range; the message names the setting, flag and variable."""


@dataclass(frozen=True)
class SupervisorSettings:
    """How the supervisor watches and recovers. Every field has a range (``RANGES``)."""

    poll_interval_s: float = 1.0  # between process-table checks
    probe_interval_s: float = 10.0  # between health calls to each leaf model
    probe_timeout_s: float = 20.0  # a health call not answered by then fails
    probe_failures: int = 2  # consecutive failed health calls that mean "hung"
    reload_timeout_s: float = 300.0  # unload + load of one model
    max_reloads: int = 3  # reloads of one model within reload_window_s before giving up
    reload_window_s: float = 600.0
    recovery_budget_s: float = 180.0  # a model down longer than this fails liveness
    exit_on_give_up: bool = False  # the launcher exits (code 3) once a model is given up

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "exit_on_give_up":
                if not isinstance(value, bool):
                    raise SettingError(describe(f.name, f"must be true or false, got {value!r}"))
                continue
            low, high = RANGES[f.name]
            integer = f.type in (int, "int")
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = ok and value == value and low <= value <= high  # NaN fails value == value
            if not ok or (integer and int(value) != value):
                kind = "an integer" if integer else "a number"
                raise SettingError(
                    describe(f.name, f"must be {kind} in [{low:g}, {high:g}], got {value!r}")
                )
        if self.probe_timeout_s > self.recovery_budget_s:
            raise SettingError(
                describe(
                    "probe_timeout_s",
                    f"must not exceed recovery_budget_s ({self.recovery_budget_s:g}), "
                    f"got {self.probe_timeout_s:g}",
                )
            )

    @classmethod
    def from_strings(cls, values: dict[str, str]) -> SupervisorSettings:
        """Settings from text (command-line flags or environment variables), checked."""
        parsed: dict[str, object] = {}
        for f in fields(cls):
            if f.name not in values or values[f.name] is None:
                continue
            raw = str(values[f.name]).strip()
            if f.name == "exit_on_give_up":
                lowered = raw.lower()
                if lowered not in ("1", "0", "true", "false", "yes", "no"):
                    raise SettingError(describe(f.name, f"must be true or false, got {raw!r}"))
                parsed[f.name] = lowered in ("1", "true", "yes")
                continue
            try:
                parsed[f.name] = int(raw) if f.type in (int, "int") else float(raw)
            except ValueError:
                kind = "an integer" if f.type in (int, "int") else "a number"
                raise SettingError(describe(f.name, f"must be {kind}, got {raw!r}")) from None
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise SettingError(f"unknown supervisor setting(s): {', '.join(sorted(unknown))}")
        return cls(**parsed)

    @classmethod
    def from_env(cls, env: dict[str, str], **defaults) -> SupervisorSettings:
        """Settings from ``FACEFUSE_SUPERVISOR_<NAME>`` variables (the container entrypoint)."""
        values = {k: str(v) for k, v in defaults.items()}
        for f in fields(cls):
            if env_name(f.name) in env:
                values[f.name] = env[env_name(f.name)]
        return cls.from_strings(values)


RANGES: dict[str, tuple[float, float]] = {
    "poll_interval_s": (0.1, 60),
    "probe_interval_s": (1, 3600),
    "probe_timeout_s": (0.5, 600),
    "probe_failures": (1, 100),
    "reload_timeout_s": (5, 3600),
    "max_reloads": (1, 100),
    "reload_window_s": (10, 86400),
    "recovery_budget_s": (10, 7200),
}


HELP = {
    "poll_interval_s": "seconds between checks of the model processes",
    "probe_interval_s": "seconds between health calls to each leaf model",
    "probe_timeout_s": "seconds a health call may take before it counts as unanswered",
    "probe_failures": "unanswered health calls in a row that mean a model is hung",
    "reload_timeout_s": "seconds one unload + load may take",
    "max_reloads": "reloads of one model within the reload window before giving up on it",
    "reload_window_s": "seconds over which reloads are counted",
    "recovery_budget_s": "seconds a model may stay down before /live fails",
}


def flag_name(name: str) -> str:
    return "--supervisor-" + name.replace("_", "-")


def env_name(name: str) -> str:
    return "FACEFUSE_SUPERVISOR_" + name.upper()


def describe(name: str, problem: str) -> str:
    return f"supervisor setting {name} ({flag_name(name)} / {env_name(name)}) {problem}"


def check_port(port: int, what: str = "--health-port") -> int:
    if not isinstance(port, int) or not 0 <= port < 65536:
        raise SettingError(f"{what} must be a port in 0..65535, got {port!r}")
    return port


# --------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Stub:
    """One Python-backend model instance process."""

    pid: int
    model: str
    instance: str
    state: str  # /proc state letter: R S D running/sleeping, T t stopped, Z zombie


def _stat(proc: Path, pid: str) -> tuple[str, int] | None:
    """(state, ppid) of ``pid`` from /proc/<pid>/stat, None when it vanished."""
    try:
        text = (proc / pid / "stat").read_text()
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :].split()
    return (rest[0], int(rest[1])) if len(rest) > 1 else None


def parse_stub_cmdline(argv: list[str]) -> tuple[str, str] | None:
    """(model, instance) from a stub's argv: ``stub <repo>/<model>/<version>/model.py ...
    <model>_<group>_<index> ...``; None for any other process."""
    if len(argv) < 2 or STUB not in Path(argv[0]).name:
        return None
    parts = Path(argv[1]).parts
    if len(parts) < 3:
        return None
    model = parts[-3]
    instance = next(
        (a for a in argv[2:] if a.startswith(model + "_") and a[len(model) + 1 :].count("_") == 1),
        f"{model}_?",
    )
    return model, instance


def read_stubs(server_pid: int, proc: Path = Path("/proc")) -> list[Stub]:
    """The stubs among the descendants of ``server_pid`` (read from /proc, no psutil)."""
    parents: dict[int, int] = {}
    states: dict[int, str] = {}
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        stat = _stat(proc, entry)
        if stat is not None:
            states[int(entry)], parents[int(entry)] = stat
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(server_pid, ()))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            raw = (proc / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        named = parse_stub_cmdline([a.decode(errors="replace") for a in raw.split(b"\0") if a])
        if named is None and states.get(pid) == "Z":
            continue  # a zombie has no command line left: its instance counts as gone
        if named is not None:
            found.append(Stub(pid, named[0], named[1], states.get(pid, "?")))
    return found


def process_alive(pid: int) -> bool:
    stat = _stat(Path("/proc"), str(pid))
    return stat is not None and stat[0] not in ("Z", "X")


# --------------------------------------------------------------------------- Triton API


class TritonApi:
    """The few HTTP calls the supervisor makes (loopback; the admin key for the repository)."""

    def __init__(self, http_url: str, admin_key: str | None, timeout_s: float = 10.0):
        self.base = http_url if http_url.startswith("http") else f"http://{http_url}"
        self.admin_key = admin_key
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: bytes | None = None, timeout_s=None):
        request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1 or the given host
            self.base + path, data=body, method=method
        )
        if self.admin_key and path.startswith("/v2/repository"):
            request.add_header(ADMIN_HEADER, self.admin_key)
        if body is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(  # noqa: S310 - the server's own loopback URL
                request, timeout=timeout_s or self.timeout_s
            ) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def status(self, path: str, timeout_s: float | None = None) -> int | None:
        try:
            return self._call("GET", path, timeout_s=timeout_s)[0]
        except (OSError, urllib.error.URLError):
            return None

    def server_live(self) -> bool:
        return self.status("/v2/health/live", 5) == 200

    def server_ready(self) -> bool:
        return self.status("/v2/health/ready", 5) == 200

    def model_ready(self, model: str) -> bool:
        return self.status(f"/v2/models/{model}/ready", 5) == 200

    def index(self) -> dict[str, str]:
        """model -> state (READY, UNAVAILABLE, LOADING, UNLOADING) from the repository index."""
        status, body = self._call("POST", "/v2/repository/index", b"{}")
        if status != 200:
            raise RuntimeError(f"repository index answered {status}: {body[:200]!r}")
        return {m["name"]: m.get("state", "") for m in json.loads(body)}

    def config(self, model: str) -> dict:
        status, body = self._call("GET", f"/v2/models/{model}/config")
        if status != 200:
            raise RuntimeError(f"config of {model} answered {status}")
        return json.loads(body)

    def unload(self, model: str, timeout_s: float) -> tuple[int, str]:
        status, body = self._call("POST", f"/v2/repository/models/{model}/unload", b"{}", timeout_s)
        return status, body.decode(errors="replace")[:300]

    def load(self, model: str, timeout_s: float) -> tuple[int, str]:
        status, body = self._call("POST", f"/v2/repository/models/{model}/load", b"{}", timeout_s)
        return status, body.decode(errors="replace")[:300]

    def replace(self, model: str, timeout_s: float) -> tuple[int, str]:
        """Load a new copy of ``model`` beside the serving one: its own config with
        :data:`GENERATION_PARAMETER` bumped, so Triton sees a changed model, keeps the old copy
        serving while the new one loads and then swaps them (in-flight requests finish)."""
        config = self.config(model)
        parameters = config.setdefault("parameters", {})
        old = parameters.get(GENERATION_PARAMETER, {}).get("string_value", "0")
        generation = int(old) + 1 if old.isdigit() else 1
        parameters[GENERATION_PARAMETER] = {"string_value": str(generation)}
        body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
        status, text = self._call("POST", f"/v2/repository/models/{model}/load", body, timeout_s)
        return status, text.decode(errors="replace")[:300]

    def probe(self, model: str, body: bytes, timeout_s: float) -> tuple[int | None, str]:
        """POST a health request; (HTTP status or None on timeout/reset, message)."""
        try:
            status, text = self._call("POST", f"/v2/models/{model}/infer", body, timeout_s)
            return status, text.decode(errors="replace")[:300]
        except (OSError, urllib.error.URLError) as exc:
            return None, f"{type(exc).__name__}: {exc}"


TRITON_DTYPES = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
}


def probe_body(config: dict) -> bytes | None:
    """The cheapest request Triton will hand to the model: every required input at its
    smallest shape (each -1 dimension 1), zeros or empty bytes. The model may answer 400 (the
    stub ran and refused it) or 200: either proves the process answers. None when an input's
    type cannot be written in JSON."""
    inputs = []
    batch = [1] if int(config.get("max_batch_size", 0) or 0) > 0 else []
    for spec in config.get("input", []):
        if spec.get("optional"):
            continue
        datatype = TRITON_DTYPES.get(spec.get("data_type", ""))
        if datatype is None:
            return None
        shape = batch + [1 if int(d) < 0 else int(d) for d in spec.get("dims", [])]
        count = 1
        for d in shape:
            count *= d
        if count > 4096:
            return None
        value = "" if datatype == "BYTES" else (False if datatype == "BOOL" else 0)
        inputs.append(
            {"name": spec["name"], "shape": shape, "datatype": datatype, "data": [value] * count}
        )
    return json.dumps({"inputs": inputs}).encode()


def unhealthy_answer(status: int | None, message: str) -> bool:
    """A health answer that shows a dead or hung process (a 400 or 200 shows a live one)."""
    if status is None:
        return True
    return "not healthy" in message or (status >= 500 and "Stub process" in message)


# --------------------------------------------------------------------------- metrics


class Metrics:
    """The supervisor's counters and gauges, rendered in Prometheus' text format."""

    HELP: ClassVar[dict[str, tuple[str, str]]] = {
        M_FAILURES: ("counter", "model process failures seen (kind: exited, stopped, hung)"),
        M_RELOADS: ("counter", "model reloads by the supervisor (outcome: ok, failed)"),
        M_RECOVERY: ("histogram", "seconds from a failure seen to the model serving again"),
        M_MODEL_UP: ("gauge", "1 while the model's processes run and answer, 0 while it is out"),
        M_GAVE_UP: ("gauge", "1 when the supervisor stopped reloading the model (reason label)"),
        M_READY: ("gauge", "1 while /ready answers 200"),
        M_LIVE: ("gauge", "1 while /live answers 200"),
    }

    def __init__(self):
        self.lock = threading.Lock()
        self.values: dict[tuple[str, tuple], float] = {}
        self.recovery: dict[str, list[float]] = {}

    def inc(self, name: str, value: float = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self.lock:
            self.values[key] = self.values.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        with self.lock:
            self.values[(name, tuple(sorted(labels.items())))] = float(value)

    def get(self, name: str, **labels: str) -> float:
        with self.lock:
            return self.values.get((name, tuple(sorted(labels.items()))), 0.0)

    def observe_recovery(self, model: str, seconds: float) -> None:
        with self.lock:
            self.recovery.setdefault(model, []).append(seconds)

    def render(self) -> str:
        lines = []
        with self.lock:
            for name, (kind, text) in self.HELP.items():
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                if kind == "histogram":
                    for model, seen in sorted(self.recovery.items()):
                        for bound in RECOVERY_BUCKETS:
                            n = sum(s <= bound for s in seen)
                            lines.append(f'{name}_bucket{{model="{model}",le="{bound}"}} {n}')
                        lines.append(f'{name}_bucket{{model="{model}",le="+Inf"}} {len(seen)}')
                        lines.append(f'{name}_sum{{model="{model}"}} {sum(seen):.3f}')
                        lines.append(f'{name}_count{{model="{model}"}} {len(seen)}')
                    continue
                for (metric, labels), value in sorted(self.values.items()):
                    if metric == name:
                        rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                        lines.append(
                            f"{name}{{{rendered}}} {value:g}" if labels else f"{name} {value:g}"
                        )
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


# --------------------------------------------------------------------------- the supervisor


@dataclass
class ModelWatch:
    """What the supervisor knows of one model."""

    name: str
    expected: int  # stub processes when healthy (sum of instance_group counts); 0: not Python
    probe: bytes | None = None
    state: str = "up"  # up, down (being recovered), failed (given up)
    down_since: float | None = None
    reason: str = ""
    reloads: deque = field(default_factory=deque)  # monotonic times of reload attempts
    stopped_seen: dict[int, int] = field(default_factory=dict)  # pid -> consecutive T states
    probe_misses: int = 0
    old_copy: dict[int, float] = field(default_factory=dict)  # pid -> when to end it


def instance_count(config: dict) -> int:
    if config.get("backend") != "python":
        return 0
    groups = config.get("instance_group") or [{"count": 1}]
    return sum(int(g.get("count", 1) or 1) for g in groups)


def event_line(event: str, **items) -> str:
    parts = [PREFIX, f"event={event}"]
    for key, value in items.items():
        text = f"{value:.1f}" if isinstance(value, float) else str(value)
        parts.append(f"{key}={json.dumps(text) if (' ' in text or not text) else text}")
    return " ".join(parts)


class Supervisor:
    """Watches one tritonserver; :meth:`run` loops until ``stop`` is set or the server exits.

    ``api`` is a :class:`TritonApi`; ``stubs`` returns the current :class:`Stub` list;
    ``kill(pid)`` sends SIGKILL; ``clock``/``sleep`` drive time (tests pass fakes)."""

    def __init__(
        self,
        api: TritonApi,
        server_pid: int,
        settings: SupervisorSettings | None = None,
        log: Callable[[str], None] | None = None,
        stubs: Callable[[], list[Stub]] | None = None,
        kill: Callable[[int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        server_alive: Callable[[], bool] | None = None,
        no_probe: Iterable[str] = ENTRY_MODELS,
    ):
        self.api = api
        self.server_pid = server_pid
        self.settings = settings or SupervisorSettings()
        self.log = log or (lambda line: print(line, flush=True))
        self.stubs = stubs or (lambda: read_stubs(server_pid))
        self.kill = kill or (lambda pid: os.kill(pid, signal.SIGKILL))
        self.clock = clock
        self.sleep = sleep
        self.server_alive = server_alive or (lambda: process_alive(server_pid))
        self.no_probe = set(no_probe)
        self.metrics = Metrics()
        self.models: dict[str, ModelWatch] = {}
        self.lock = threading.RLock()
        self.discovered = False
        self.server_ok = False
        self.server_exited = False
        self.gave_up = False
        self.last_tick = clock()
        self._probe_due: dict[str, float] = {}
        self.stopping = threading.Event()  # run()'s stop event: ends a reload in progress

    # ---- discovery

    def discover(self) -> None:
        """The models the server runs, their stub counts and health requests."""
        models = {}
        for name, state in sorted(self.api.index().items()):
            if state != "READY":
                continue
            config = self.api.config(name)
            probe = None if name in self.no_probe else probe_body(config)
            models[name] = ModelWatch(name, instance_count(config), probe)
        with self.lock:
            self.models = models
            for watch in models.values():
                self.metrics.set(M_MODEL_UP, 1, model=watch.name)
                self.metrics.set(M_GAVE_UP, 0, model=watch.name)
            self.discovered = True
        summary = ",".join(f"{m.name}x{m.expected}" for m in models.values())
        self.log(event_line("watching", models=summary, server_pid=self.server_pid))

    # ---- probes of health

    def readiness(self) -> tuple[bool, str]:
        with self.lock:
            if self.server_exited:
                return False, "tritonserver exited"
            if not self.discovered:
                return False, "starting"
            out = [
                f"{m.name} {m.state}: {m.reason}" for m in self.models.values() if m.state != "up"
            ]
            if out:
                return False, "; ".join(out)
            if not self.server_ok:
                return False, "tritonserver not ready"
        return True, "ok"

    def liveness(self) -> tuple[bool, str]:
        now = self.clock()
        with self.lock:
            if self.server_exited:
                return False, "tritonserver exited"
            failed = [f"{m.name}: {m.reason}" for m in self.models.values() if m.state == "failed"]
            if failed:
                return False, "gave up on " + "; ".join(failed)
            budget = self.settings.recovery_budget_s
            slow = [
                m.name
                for m in self.models.values()
                if m.state == "down" and m.down_since is not None and now - m.down_since > budget
            ]
            if slow:
                return False, f"not recovered within {budget:g} s: {', '.join(slow)}"
            stale = now - self.last_tick
            limit = max(30.0, 5 * self.settings.poll_interval_s) + self.settings.reload_timeout_s
            if stale > limit:
                return False, f"supervisor loop silent for {stale:.0f} s"
        return True, "ok"

    def status(self) -> dict:
        ready, why_not_ready = self.readiness()
        live, why_not_live = self.liveness()
        with self.lock:
            models = {
                m.name: {
                    "state": m.state,
                    "reason": m.reason,
                    "instances": m.expected,
                    "reloads_in_window": len(m.reloads),
                }
                for m in self.models.values()
            }
        return {
            "ready": ready,
            "ready_reason": why_not_ready,
            "live": live,
            "live_reason": why_not_live,
            "models": models,
        }

    # ---- one pass

    def find_failures(self) -> dict[str, tuple[str, str]]:
        """model -> (kind, detail) for each model with a dead, stopped or hung process."""
        old_copies = {pid for watch in self.models.values() for pid in watch.old_copy}
        by_model: dict[str, list[Stub]] = {}
        for stub in self.stubs():
            if stub.pid not in old_copies:
                by_model.setdefault(stub.model, []).append(stub)
        found: dict[str, tuple[str, str]] = {}
        for watch in self.models.values():
            if watch.state != "up":
                continue
            if watch.expected:
                alive = [s for s in by_model.get(watch.name, []) if s.state not in ("Z", "X")]
                if len(alive) < watch.expected:
                    gone = watch.expected - len(alive)
                    found[watch.name] = (
                        "exited",
                        f"{gone} of {watch.expected} instance process(es) gone",
                    )
                    continue
                stopped = [s for s in alive if s.state in ("T", "t")]
                seen = {s.pid: watch.stopped_seen.get(s.pid, 0) + 1 for s in stopped}
                watch.stopped_seen = seen
                confirmed = [s for s in stopped if seen[s.pid] >= 2]
                if confirmed:
                    names = ", ".join(f"{s.instance} (pid {s.pid})" for s in confirmed)
                    found[watch.name] = ("stopped", f"stopped process: {names}")
                    continue
            if watch.probe_misses >= self.settings.probe_failures:
                found[watch.name] = (
                    "hung",
                    f"{watch.probe_misses} health calls unanswered or unhealthy",
                )
        return found

    def run_probes(self) -> None:
        """One health call to each probed model that is due (called from the probe thread)."""
        now = self.clock()
        with self.lock:
            due = [
                m
                for m in self.models.values()
                if m.state == "up"
                and m.probe is not None
                and self._probe_due.get(m.name, 0.0) <= now
            ]
        for watch in due:
            if self.stopping.is_set():
                return
            self._probe_due[watch.name] = now + self.settings.probe_interval_s
            status, message = self.api.probe(watch.name, watch.probe, self.settings.probe_timeout_s)
            with self.lock:
                if watch.state != "up":
                    continue
                if unhealthy_answer(status, message):
                    watch.probe_misses += 1
                    self.log(
                        event_line(
                            "health_call_failed",
                            model=watch.name,
                            status=status or "timeout",
                            misses=watch.probe_misses,
                            detail=message.splitlines()[0] if message else "",
                        )
                    )
                else:
                    watch.probe_misses = 0

    def tick(self) -> None:
        """Check the server and every model once; recover what failed."""
        self.last_tick = self.clock()
        if not self.server_alive():
            with self.lock:
                if not self.server_exited:
                    self.log(event_line("server_exited", server_pid=self.server_pid))
                self.server_exited = True
            self._publish()
            return
        self.server_ok = self.api.server_ready()
        with self.lock:
            failures = self.find_failures()
        if failures and (self.stopping.is_set() or not self.api.server_live()):
            return  # processes end with a server that shuts down: nothing to replace
        if failures:
            # a model an operator unloaded through the admin API is not READY in the index
            # (a dead stub leaves it READY): stop watching it instead of loading it back
            try:
                index = self.api.index()
            except (OSError, RuntimeError, ValueError):
                index = {}
            for model in [m for m in failures if index and index.get(m) != "READY"]:
                failures.pop(model)
                with self.lock:
                    self.models.pop(model, None)
                self.log(event_line("unwatched", model=model, state=index.get(model, "gone")))
        for model, (kind, detail) in failures.items():
            self.on_failure(model, kind, detail)
        self.end_old_copies()
        # models taken out whose reload failed earlier: try again (bounded by max_reloads)
        for watch in list(self.models.values()):
            if watch.state == "down" and self._backoff_over(watch):
                self.recover(watch)
        self._publish()

    def _publish(self) -> None:
        ready, _ = self.readiness()
        live, _ = self.liveness()
        self.metrics.set(M_READY, int(ready))
        self.metrics.set(M_LIVE, int(live))

    # ---- recovery

    def on_failure(self, model: str, kind: str, detail: str) -> None:
        watch = self.models[model]
        now = self.clock()
        with self.lock:
            watch.state, watch.down_since = "down", now
            watch.reason = f"{kind}: {detail}"
            watch.probe_misses = 0
            self.metrics.inc(M_FAILURES, model=model, kind=kind)
            self.metrics.set(M_MODEL_UP, 0, model=model)
        self.log(event_line("failure", model=model, kind=kind, detail=detail))
        self._publish()
        self.recover(watch)

    def _backoff_over(self, watch: ModelWatch) -> bool:
        """A failed reload is retried after 2, 4, 8 ... s (at most 60), not at every tick."""
        if not watch.reloads:
            return True
        wait = min(60.0, 2.0 ** len(watch.reloads))
        return self.clock() - watch.reloads[-1] >= wait

    def _budget_left(self, watch: ModelWatch) -> bool:
        now = self.clock()
        while watch.reloads and now - watch.reloads[0] > self.settings.reload_window_s:
            watch.reloads.popleft()
        return len(watch.reloads) < self.settings.max_reloads

    def give_up(self, watch: ModelWatch) -> None:
        s = self.settings
        reason = (
            f"{len(watch.reloads)} reloads within {s.reload_window_s:g} s did not keep it up "
            f"(last: {watch.reason})"
        )
        with self.lock:
            watch.state, watch.reason = "failed", reason
            self.gave_up = True
            self.metrics.set(M_GAVE_UP, 1, model=watch.name)
            self.metrics.set(M_MODEL_UP, 0, model=watch.name)
        self.log(event_line("gave_up", model=watch.name, reason=reason))
        self._publish()

    def recover(self, watch: ModelWatch) -> bool:
        """Kill what is left of the model's processes, unload, load, check; True when back."""
        if not self._budget_left(watch):
            self.give_up(watch)
            return False
        s = self.settings
        watch.reloads.append(self.clock())
        started = self.clock()
        self.log(event_line("reload", model=watch.name, attempt=len(watch.reloads)))
        old = [stub for stub in self.stubs() if stub.model == watch.name]
        if not watch.reason.startswith("exited"):
            # a stopped or hung process may never finish an unload: kill it first
            for stub in old:
                self._kill(stub)
        error = self._reload(watch, old, started + s.reload_timeout_s)
        if error is None:
            seconds = self.clock() - (watch.down_since or started)
            end_at = self.clock() + OLD_COPY_GRACE_S
            left = {st.pid for st in self.stubs() if st.state not in ("Z", "X")}
            with self.lock:
                watch.old_copy.update({st.pid: end_at for st in old if st.pid in left})
                watch.state, watch.reason, watch.down_since = "up", "", None
                watch.stopped_seen, watch.probe_misses = {}, 0
                self.metrics.inc(M_RELOADS, model=watch.name, outcome="ok")
                self.metrics.set(M_MODEL_UP, 1, model=watch.name)
                self.metrics.observe_recovery(watch.name, seconds)
            self.log(event_line("recovered", model=watch.name, seconds=seconds))
            self._publish()
            return True
        with self.lock:
            watch.reason = f"reload failed: {error}"
            self.metrics.inc(M_RELOADS, model=watch.name, outcome="failed")
        self.log(event_line("reload_failed", model=watch.name, error=error))
        if not self._budget_left(watch):
            self.give_up(watch)
        return False

    def end_old_copies(self) -> None:
        """SIGKILL the stubs of replaced copies whose grace is over; forget the ones gone."""
        if not any(watch.old_copy for watch in self.models.values()):
            return  # the usual pass: no second /proc scan
        now = self.clock()
        listed = {st.pid: st for st in self.stubs() if st.state not in ("Z", "X")}
        for watch in list(self.models.values()):
            for pid, end_at in list(watch.old_copy.items()):
                if pid not in listed:
                    watch.old_copy.pop(pid)
                elif now >= end_at:
                    watch.old_copy.pop(pid)
                    self.log(event_line("old_copy_ended", model=watch.name, pid=pid))
                    self._kill(listed[pid])
                    removed = remove_orphaned_shm_regions()
                    if removed:
                        self.log(event_line("shm_removed", regions=removed))

    def _kill(self, stub: Stub) -> None:
        try:
            self.kill(stub.pid)
            self.log(event_line("killed", model=stub.model, instance=stub.instance, pid=stub.pid))
        except ProcessLookupError:
            pass

    def _reload(self, watch: ModelWatch, old: list[Stub], deadline: float) -> str | None:
        name = watch.name
        remaining = lambda: max(1.0, deadline - self.clock())  # noqa: E731
        old_pids = {stub.pid for stub in old}
        try:
            status, text = self.api.replace(name, remaining())
        except (OSError, RuntimeError, ValueError) as exc:
            status, text = 0, f"{type(exc).__name__}: {exc}"
        if status == 200:
            return self._wait_new_stubs(watch, old_pids, deadline)
        self.log(event_line("replace_refused", model=name, status=status, detail=text[:200]))
        status, text = self.api.unload(name, remaining())
        if status != 200:
            return f"unload answered {status}: {text}"
        # The unload returns at once. Wait until the model is gone, or UNLOAD_GRACE_S: on
        # Triton 2.51 a request handed to the dead instance while it unloads can hang there
        # and keep the model UNLOADING for ever; a load then starts new instances beside it
        # (and sibling instances still finishing requests end when they are done).
        unloaded_at = self.clock()
        while True:
            if self.stopping.is_set():
                return "supervisor stopping"
            try:
                state = self.api.index().get(name, "")
            except (OSError, RuntimeError):
                state = "?"
            left = [st for st in self.stubs() if st.pid in old_pids and st.state not in ("Z", "X")]
            if state not in ("READY", "UNLOADING", "?") and not left:
                break
            if self.clock() - unloaded_at >= UNLOAD_GRACE_S:
                self.log(
                    event_line("unload_pending", model=name, state=state, old_processes=len(left))
                )
                break
            self.sleep(0.1)
        status, text = self.api.load(name, remaining())
        if status != 200:
            return f"load answered {status}: {text}"
        return self._wait_new_stubs(watch, old_pids, deadline)

    def _wait_new_stubs(self, watch: ModelWatch, old_pids: set[int], deadline: float) -> str | None:
        """None once ``watch.expected`` new stubs run and the model answers ready."""
        name = watch.name
        while True:
            if self.stopping.is_set():
                return "supervisor stopping"
            running = [
                st
                for st in self.stubs()
                if st.model == name and st.pid not in old_pids and st.state not in ("Z", "X", "T")
            ]
            if len(running) >= watch.expected and self.api.model_ready(name):
                return None
            if self.clock() > deadline:
                return f"{len(running)} of {watch.expected} processes after load"
            self.sleep(0.1)

    # ---- loops

    def run(self, stop: threading.Event) -> int:
        """Discover, then check every ``poll_interval_s`` until ``stop``; 0 when stopped, 1 when
        the server exited, 3 when a model was given up and ``exit_on_give_up`` is set."""
        self.stopping = stop
        while not stop.is_set() and not self.discovered:
            if not self.server_alive():
                self.server_exited = True
                return 1
            try:
                if self.api.server_ready():
                    self.discover()
                    break
            except (OSError, RuntimeError, ValueError) as exc:
                self.log(event_line("discovery_retry", error=str(exc)[:200]))
            stop.wait(1.0)
        prober = threading.Thread(target=self._probe_loop, args=(stop,), daemon=True)
        prober.start()
        while not stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # keep watching: one failed pass is logged, not fatal
                self.log(event_line("tick_error", error=f"{type(exc).__name__}: {exc}"[:300]))
            if self.server_exited:
                return 1
            if self.gave_up and self.settings.exit_on_give_up:
                self.log(event_line("exit", reason="gave up on a model; exiting for a restart"))
                return 3
            stop.wait(self.settings.poll_interval_s)
        return 0

    def _probe_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.run_probes()
            except Exception as exc:
                self.log(event_line("probe_error", error=f"{type(exc).__name__}: {exc}"[:300]))
            stop.wait(min(1.0, self.settings.probe_interval_s))


# --------------------------------------------------------------------------- HTTP endpoints


class HealthServer:
    """``/ready``, ``/live`` (200 or 503 with the reason), ``/metrics`` and ``/status`` (JSON)
    of a :class:`Supervisor`, on their own port, in a daemon thread."""

    def __init__(self, supervisor: Supervisor, host: str = "127.0.0.1", port: int = 0):
        check_port(port)
        owner = supervisor

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?", 1)[0]
                if path in ("/ready", "/live"):
                    ok, reason = owner.readiness() if path == "/ready" else owner.liveness()
                    self._send(200 if ok else 503, reason + "\n", "text/plain")
                elif path == "/metrics":
                    owner._publish()
                    self._send(200, owner.metrics.render(), "text/plain; version=0.0.4")
                elif path == "/status":
                    self._send(200, json.dumps(owner.status(), indent=1), "application/json")
                else:
                    self._send(404, "not found: /ready /live /metrics /status\n", "text/plain")

            def _send(self, code: int, text: str, kind: str) -> None:
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # probes every few seconds: no access log
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> HealthServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------- launcher glue


class Supervision:
    """What a launcher starts beside tritonserver: the supervisor loop in a thread and its
    health endpoints. ``with Supervision(...) as sup:`` then poll ``sup.exit_code``."""

    def __init__(
        self,
        http_url: str,
        server_pid: int,
        admin_key: str | None,
        settings: SupervisorSettings,
        health_host: str = "127.0.0.1",
        health_port: int = DEFAULT_HEALTH_PORT,
        log: Callable[[str], None] | None = None,
    ):
        self.stop_event = threading.Event()
        self.supervisor = Supervisor(TritonApi(http_url, admin_key), server_pid, settings, log)
        self.health = HealthServer(self.supervisor, health_host, health_port)
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="supervisor")

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health.port}"

    def _run(self) -> None:
        self.exit_code = self.supervisor.run(self.stop_event)

    def start(self) -> Supervision:
        self.health.start()
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)
        self.health.stop()

    def __enter__(self) -> Supervision:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
