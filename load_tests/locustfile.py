"""Locust load test for a facefuse deployment (HTTP, tritonclient inside Locust users).

Run (headless, step load, CSV out; loopback only, bounded in time)::

    locust -f load_tests/locustfile.py --headless --host http://127.0.0.1:8000 \\
        --csv reports/locust --run-time 5m

Options (environment variables, all optional):

- ``FACEFUSE_IMAGES``: folder of JPEG/PNG photos used as sources and targets (default: the
  photos that ship in installed wheels, see ``facefuse.core.samples``);
- ``FACEFUSE_PROMPTS``: text file of instructions, one per line (default: a built-in list);
- ``FACEFUSE_BAD_SHARE``: share of deliberately malformed requests (no face, corrupt bytes),
  which must fail fast with HTTP 400 (default 0.05);
- ``FACEFUSE_STEPS``: STEPS sent with every request (default: the server's default);
- ``FACEFUSE_MAX_USERS``, ``FACEFUSE_STEP_USERS``, ``FACEFUSE_STEP_SECONDS``,
  ``FACEFUSE_DURATION``: the step load shape (default 4 users, +1 every 30 s, 300 s);
- ``FACEFUSE_RETRIES``: retries of a "try again" answer (HTTP 503 while the supervisor replaces
  a model process, a connection reset; ``facefuse.client.retryable``), with the client's
  backoff, within ``FACEFUSE_RETRY_DEADLINE`` seconds (default 3 and 120; 0 retries: off).

A malformed request counts as a success only when it is refused with 400; a valid one only when
it returns a PNG. Anything else is a failure in Locust's statistics. Each retried answer is
recorded as a failure of its own entry, ``facefusion [retried]``, so retries are counted apart
from the requests (``facefusion``), whose outcome is that of the last attempt.
"""

from __future__ import annotations

import io
import os
import random
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import tritonclient.http as httpclient
from facefuse.client import RetryPolicy, retryable
from locust import LoadTestShape, User, between, events, task
from PIL import Image

from facefuse.core import contract
from facefuse.core.samples import astronaut_png, grace_hopper_jpeg

DEFAULT_INSTRUCTIONS = [
    "make her smile, keep the glasses",
    "make him look serious, studio light",
    "smiling, soft lighting, keep the hair",
    "neutral expression, natural light, sharp focus",
    "make her look ten years younger, keep the earrings",
    "add a gentle smile, warm light, highly detailed",
]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def load_images() -> list[bytes]:
    folder = os.environ.get("FACEFUSE_IMAGES")
    if not folder:
        return [grace_hopper_jpeg(), astronaut_png()]
    files = sorted(
        p for p in Path(folder).iterdir() if p.suffix.lower() in {".jpg", ".jpeg", ".png"}
    )
    if not files:
        raise SystemExit(f"FACEFUSE_IMAGES={folder}: no .jpg/.png files")
    return [p.read_bytes() for p in files]


def load_instructions() -> list[str]:
    path = os.environ.get("FACEFUSE_PROMPTS")
    if not path:
        return DEFAULT_INSTRUCTIONS
    lines = [line.strip() for line in Path(path).read_text(errors="replace").splitlines()]
    return [line[:500] for line in lines if line]


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


IMAGES = load_images()
INSTRUCTIONS = load_instructions()
NO_FACE = _png(np.full((256, 256, 3), 127, dtype=np.uint8))
CORRUPT = IMAGES[0][: len(IMAGES[0]) // 3]


@events.test_start.add_listener
def _refuse_remote_hosts(environment, **_):
    host = urlparse(environment.host or "").hostname
    if host not in LOOPBACK:
        raise SystemExit(f"--host {environment.host}: this load test targets loopback only")


def _inputs(source: bytes, target: bytes, instruction: str, steps: str | None):
    request = contract.facefusion_request(
        source, target, instruction, steps=int(steps) if steps else None
    )
    return contract.infer_inputs(httpclient, contract.FACEFUSION, request)


class FacefuseUser(User):
    """One user: sends facefusion requests back to back (a short random pause between)."""

    wait_time = between(0.0, 0.5)

    def on_start(self) -> None:
        url = urlparse(self.host)
        if url.hostname not in LOOPBACK:  # checked again here: never connect elsewhere
            raise SystemExit(f"--host {self.host}: this load test targets loopback only")
        self.client = httpclient.InferenceServerClient(
            f"{url.hostname}:{url.port or 8000}", network_timeout=600.0, connection_timeout=600.0
        )
        self.bad_share = float(_env("FACEFUSE_BAD_SHARE", "0.05"))
        self.steps = os.environ.get("FACEFUSE_STEPS")
        retries = int(_env("FACEFUSE_RETRIES", "3"))
        self.retry = RetryPolicy(
            attempts=retries + 1, deadline_s=float(_env("FACEFUSE_RETRY_DEADLINE", "120"))
        )

    def on_stop(self) -> None:
        self.client.close()

    def _record(self, name: str, started: float, length: int, exception: Exception | None) -> None:
        self.environment.events.request.fire(
            request_type="infer",
            name=name,
            response_time=(time.perf_counter() - started) * 1000,
            response_length=length,
            exception=exception,
            context={},
        )

    @task
    def fuse(self) -> None:
        source, target = random.choice(IMAGES), random.choice(IMAGES)
        instruction = random.choice(INSTRUCTIONS)
        roll = random.random()
        if roll < self.bad_share / 2:
            self._malformed("facefusion [no face]", NO_FACE, target, instruction)
        elif roll < self.bad_share:
            self._malformed("facefusion [corrupt bytes]", source, CORRUPT, instruction)
        else:
            self._fuse_with_retries(_inputs(source, target, instruction, self.steps))

    def _fuse_with_retries(self, inputs) -> None:
        """One fusion; a "try again" answer is recorded under ``facefusion [retried]`` and the
        request sent again after the policy's backoff, while attempts and deadline allow."""
        policy, attempt = self.retry, 0
        deadline = time.monotonic() + policy.deadline_s
        started = time.perf_counter()
        while True:
            attempt += 1
            tried = time.perf_counter()
            try:
                result = self.client.infer(contract.FACEFUSION.name, inputs)
                png = result.as_numpy(contract.IMAGE.name).reshape(-1)[0]
                error = (
                    None if png[:8] == b"\x89PNG\r\n\x1a\n" else ValueError("IMAGE is not a PNG")
                )
                self._record("facefusion", started, len(png), error)
                return
            except Exception as exc:
                pause = policy.delay(attempt)
                if (
                    attempt >= policy.attempts
                    or not retryable(exc)
                    or time.monotonic() + pause >= deadline
                ):
                    self._record("facefusion", started, 0, exc)
                    return
                self._record("facefusion [retried]", tried, 0, exc)
                time.sleep(pause)  # gevent-patched under Locust

    def _malformed(self, name: str, source: bytes, target: bytes, instruction: str) -> None:
        started = time.perf_counter()
        try:
            self.client.infer(
                contract.FACEFUSION.name, _inputs(source, target, instruction, self.steps)
            )
            self._record(name, started, 0, AssertionError("malformed request was accepted"))
        except Exception as exc:
            status = str(getattr(exc, "status", lambda: "")())
            ok = status == "400"
            self._record(
                name,
                started,
                0,
                None if ok else AssertionError(f"expected 400, got {status}: {exc}"),
            )


class StepLoad(LoadTestShape):
    """Add ``FACEFUSE_STEP_USERS`` users every ``FACEFUSE_STEP_SECONDS`` up to
    ``FACEFUSE_MAX_USERS``; stop after ``FACEFUSE_DURATION`` seconds."""

    def tick(self):
        max_users = int(_env("FACEFUSE_MAX_USERS", "4"))
        step_users = int(_env("FACEFUSE_STEP_USERS", "1"))
        step_seconds = float(_env("FACEFUSE_STEP_SECONDS", "30"))
        duration = float(_env("FACEFUSE_DURATION", "300"))
        elapsed = self.get_run_time()
        if elapsed > duration:
            return None
        users = min(max_users, step_users * (1 + int(elapsed // step_seconds)))
        return users, max(1, step_users)
