"""Self-healing through a real tritonserver started by ``facefuse serve`` (issue 33).

- chaos: under 4 fusion clients, each Python-backend model's process is SIGKILLed in turn;
  the supervisor sees it, ``/ready`` answers 503 while the model is out, the model is reloaded
  and fusions succeed again; every failed request is a clean "try again" answer (HTTP 503 from
  the pipeline, or Triton's own "not healthy" line when the pipeline's own process died), and
  the client with the default retry policy sees no failure at all;
- a hang: a SIGSTOPped ``unet`` process is found, killed and replaced; no request hangs;
- a model that keeps dying: after ``--supervisor-max-reloads`` it stays out, ``/ready`` and
  ``/live`` fail with the reason, the metric says so, and the supervisor does not spin.

The per-model figures (failed requests, seconds to recovery, what the probes said) are printed
for docs/reliability.md; the assertions are on behaviour only.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from facefuse.client import NO_RETRY, Client, ClientError, RetryPolicy

from facefuse.serving.supervisor import parse_stub_cmdline
from tests.integration.polling import wait_for

pytestmark = pytest.mark.integration
KEY = "s" * 32
SERVE = [sys.executable, "-m", "facefuse.cli", "serve"]
FAST = [  # quick checks, so that a test run stays short
    "--supervisor-poll-interval-s",
    "0.5",
    "--supervisor-probe-interval-s",
    "2",
    "--supervisor-probe-timeout-s",
    "10",
]


@dataclass
class Serve:
    process: subprocess.Popen
    lines: list[str]
    http: str
    health: str

    @property
    def triton(self) -> psutil.Process:
        return next(
            p
            for p in psutil.Process(self.process.pid).children(recursive=True)
            if p.name() == "tritonserver"
        )

    def stubs(self) -> dict[int, tuple[str, str]]:
        """pid -> (model, instance) of the live Python-backend stubs."""
        found = {}
        for child in self.triton.children(recursive=True):
            try:
                named = parse_stub_cmdline(child.cmdline())
                if named and child.status() != psutil.STATUS_ZOMBIE:
                    found[child.pid] = named
            except psutil.Error:
                continue
        return found

    def events(self, event: str, model: str | None = None) -> list[str]:
        needle = f"event={event}" + (f" model={model}" if model else "")
        return [x for x in list(self.lines) if "facefuse-supervisor:" in x and needle in x]

    def probe(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.health + path, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


def start_serve(repository: Path, *extra: str) -> Serve:
    command = [sys.executable, "-m", "facefuse.cli", "serve", "--repository", str(repository)]
    command += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
    command += ["--health-port", "0", "--admin-key", KEY, *extra]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
    try:
        wait_for(
            lambda: process.poll() is not None or any("event=watching" in x for x in lines),
            300,
            "facefuse serve to start and its supervisor to watch",
        )
        assert process.poll() is None, "".join(lines[-40:])
        http = re.search(r"HTTP (127\.0\.0\.1:\d+)", "".join(lines)).group(1)
        health = re.search(r"supervisor: (http://127\.0\.0\.1:\d+)/ready", "".join(lines))
        return Serve(process, lines, http, health.group(1))
    except BaseException:
        stop_serve(process)
        raise


def stop_serve(process: subprocess.Popen) -> None:
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        children = []
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for child in children:  # never leave a tritonserver or a stub behind
        try:
            child.kill()
        except psutil.Error:
            pass


@pytest.fixture(scope="module")
def serve(tiny_repository):
    running = start_serve(tiny_repository, *FAST)
    try:
        yield running
    finally:
        stop_serve(running.process)


@dataclass
class Traffic:
    """4 fusion clients: three see every failure (NO_RETRY), one retries (default policy)."""

    serve: Serve
    images: tuple[bytes, bytes]
    stop: threading.Event = field(default_factory=threading.Event)
    events: list = field(default_factory=list)  # (sent, done, client, ok, status, message)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list = field(default_factory=list)
    in_flight: dict = field(default_factory=dict)

    def start(self, clients: int = 4) -> Traffic:
        for index in range(clients):
            retry = RetryPolicy(deadline_s=120) if index == clients - 1 else NO_RETRY
            thread = threading.Thread(target=self._user, args=(index, retry), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def _user(self, index: int, retry: RetryPolicy) -> None:
        source, target = self.images
        with Client(self.serve.http, "http", timeout_s=120, retry=retry) as client:
            while not self.stop.is_set():
                sent = time.monotonic()
                self.in_flight[index] = sent
                try:
                    client.fuse(source, target, "make her smile", steps=2)
                    row = (sent, time.monotonic(), index, True, "", "")
                except ClientError as exc:
                    row = (sent, time.monotonic(), index, False, str(exc.status), str(exc))
                self.in_flight.pop(index, None)
                with self.lock:
                    self.events.append(row)
                if not row[3]:
                    self.stop.wait(0.2)

    def ok_after(self, t: float) -> int:
        with self.lock:
            return sum(1 for e in self.events if e[0] > t and e[3])

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=150)
        assert not any(t.is_alive() for t in self.threads), "a client call never returned"


def clean_failure(status: str, message: str) -> bool:
    """A "try again" answer: the pipeline's 503 naming the model and the retry hint, or
    Triton's own one line when the pipeline's own process died (500 "not healthy") or while
    the pipeline itself is being reloaded (404 "unknown model ... no available versions")."""
    if status == "503":
        return "is unavailable" in message and "retry in a few seconds" in message
    return (status == "500" and "is not healthy" in message) or (
        status in ("400", "404") and "unknown model" in message
    )


def test_each_model_process_killed_under_four_clients_is_replaced(serve, sample_images):
    stubs = serve.stubs()
    models = sorted({model for model, _ in stubs.values()})
    assert {"facefusion", "unet", "vae_decoder", "text_encoder", "face_analyzer"} <= set(models)
    traffic = Traffic(serve, sample_images).start()
    report = []
    try:
        wait_for(lambda: traffic.ok_after(0) >= 4, 300, "the first fusions")
        for model in models:
            victim = next(pid for pid, (m, _) in serve.stubs().items() if m == model)
            before = len(serve.events("recovered", model))
            probes: list[int] = []
            watching = threading.Event()

            def watch_ready(probes=probes, watching=watching):
                while not watching.is_set():
                    probes.append(serve.probe("/ready")[0])
                    time.sleep(0.05)

            watcher = threading.Thread(target=watch_ready, daemon=True)
            watcher.start()
            killed_at = time.monotonic()
            psutil.Process(victim).kill()
            wait_for(
                lambda m=model, n=before: len(serve.events("recovered", m)) > n,
                180,
                f"{model} to be reloaded",
            )
            recovered_at = time.monotonic()
            wait_for(lambda: serve.probe("/ready")[0] == 200, 60, "readiness back")
            # fusions succeed again: every client gets one sent after the recovery
            wait_for(lambda t=recovered_at: traffic.ok_after(t) >= 4, 300, "fusions again")
            watching.set()
            watcher.join()
            new = [pid for pid, (m, _) in serve.stubs().items() if m == model]
            assert new and victim not in new, (model, new)
            assert 503 in probes, f"/ready never said 503 while {model} was out: {set(probes)}"
            with traffic.lock:
                window = [e for e in traffic.events if killed_at <= e[1] and e[0] <= recovered_at]
                later = [e for e in traffic.events if e[0] >= killed_at + 15]
            failed = [e for e in window if not e[3]]
            first_ok = min(
                (e[1] for e in traffic.events if e[3] and e[0] >= killed_at), default=None
            )
            report.append(
                (
                    model,
                    len(failed),
                    len(window),
                    round(recovered_at - killed_at, 1),
                    round(first_ok - killed_at, 1) if first_ok else None,
                    f"{sum(e[3] for e in later)}/{len(later)}",
                    sorted(set(probes)),
                )
            )
    finally:
        traffic.finish()
    failures = [e for e in traffic.events if not e[3]]
    print(
        "\nmodel, failed / requests during the outage, s to recovered, s to first ok, "
        "ok / sent from 15 s after the kill (until the next kill), /ready"
    )
    for row in report:
        print(*row)
    print(f"total: {len(traffic.events)} requests, {len(failures)} failed")
    print("failures by status:", sorted({(e[4], e[5][:90]) for e in failures}))
    for _, _, client, _, status, message in failures:
        assert client != 3, f"the retrying client saw a failure: {status} {message}"
        assert clean_failure(status, message), (status, message)
    assert "Traceback" not in "".join(serve.lines)


def test_a_stopped_model_process_is_found_killed_and_replaced(serve, sample_images):
    victim = next(pid for pid, (m, _) in serve.stubs().items() if m == "unet")
    before = len(serve.events("recovered", "unet"))
    traffic = Traffic(serve, sample_images).start()
    try:
        wait_for(lambda: traffic.ok_after(0) >= 2, 300, "the first fusions")
        stopped_at = time.monotonic()
        psutil.Process(victim).suspend()  # SIGSTOP: alive, but answers nothing
        wait_for(
            lambda: len(serve.events("recovered", "unet")) > before, 180, "unet to be replaced"
        )
        recovered_at = time.monotonic()
        assert serve.events("failure", "unet")[-1].count("kind=stopped") == 1
        assert any(f"pid={victim}" in x for x in serve.events("killed", "unet"))
        assert not psutil.pid_exists(victim) or (
            psutil.Process(victim).status() == psutil.STATUS_ZOMBIE
        )
        wait_for(lambda t=recovered_at: traffic.ok_after(t) >= 4, 300, "fusions again")
    finally:
        traffic.finish()  # asserts that every client call returned
    failures = [e for e in traffic.events if not e[3]]
    for _, _, _, _, status, message in failures:
        assert clean_failure(status, message), (status, message)
    longest = max(e[1] - e[0] for e in traffic.events)
    print(
        f"\nSIGSTOP unet: replaced after {recovered_at - stopped_at:.1f} s; "
        f"{len(failures)} of {len(traffic.events)} requests failed; longest request {longest:.1f} s"
    )


def test_a_model_that_keeps_dying_stays_out_without_spinning(tiny_repository, tmp_path):
    repository = tmp_path / "model_repository"
    for model in ("prompt_optimizer", "face_analyzer"):
        shutil.copytree(tiny_repository / model, repository / model)
    serve = start_serve(repository, *FAST, "--supervisor-max-reloads", "2")
    try:

        def kill_and_wait(n: int):
            victim = next(p for p, (m, _) in serve.stubs().items() if m == "prompt_optimizer")
            psutil.Process(victim).kill()
            wait_for(
                lambda: len(serve.events("recovered", "prompt_optimizer")) >= n,
                120,
                f"recovery {n}",
            )

        kill_and_wait(1)
        kill_and_wait(2)
        victim = next(p for p, (m, _) in serve.stubs().items() if m == "prompt_optimizer")
        psutil.Process(victim).kill()
        wait_for(
            lambda: serve.events("gave_up", "prompt_optimizer"), 120, "the supervisor to give up"
        )
        reloads = len(serve.events("reload", "prompt_optimizer"))
        # it stays out: no new process, readiness and liveness fail and say why
        time.sleep(3)  # several poll intervals, to show that nothing spins
        assert len(serve.events("reload", "prompt_optimizer")) == reloads == 2
        assert len(serve.events("gave_up")) == 1
        assert "prompt_optimizer" not in {m for m, _ in serve.stubs().values()}
        status, reason = serve.probe("/ready")
        assert status == 503 and "prompt_optimizer failed" in reason, reason
        status, reason = serve.probe("/live")
        assert status == 503 and "gave up on prompt_optimizer" in reason, reason
        metrics = serve.probe("/metrics")[1]
        assert 'facefuse_supervisor_gave_up{model="prompt_optimizer"} 1' in metrics
        assert 'facefuse_supervisor_reloads_total{model="prompt_optimizer",outcome="ok"} 2' in (
            metrics
        )
        assert 'facefuse_supervisor_model_up{model="face_analyzer"} 1' in metrics
        assert serve.process.poll() is None, "serve exited (default: stay up, out of rotation)"
        assert "2 reloads within 600 s did not keep it up" in serve.events("gave_up")[0]
    finally:
        stop_serve(serve.process)


def test_serve_refuses_a_supervisor_setting_out_of_range_and_names_it(tmp_path):
    for flag, value, name in (
        ("--supervisor-poll-interval-s", "0", "poll_interval_s"),
        ("--supervisor-max-reloads", "0", "max_reloads"),
        ("--supervisor-probe-timeout-s", "nan", "probe_timeout_s"),
        ("--health-port", "70000", "--health-port"),
    ):
        done = subprocess.run(
            [*SERVE, "--repository", str(tmp_path), flag, value],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert name in done.stderr and "starting tritonserver" not in done.stdout, done.stderr
