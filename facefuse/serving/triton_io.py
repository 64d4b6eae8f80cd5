"""Thin helpers for the Python-backend ``model.py`` adapters (import only inside a stub).

One place maps facefuse errors to Triton errors: :class:`InvalidInput` becomes INVALID_ARG
(HTTP 400 / gRPC INVALID_ARGUMENT) with the message tagged for BLS callers;
:class:`ModelUnavailable` (a composing model that is dead, being reloaded by the supervisor, or
silent past the BLS timeout) becomes UNAVAILABLE (HTTP 503 / gRPC UNAVAILABLE) with a retry
hint; anything else becomes INTERNAL with a one-line message (no traceback reaches the client).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence

import numpy as np

from facefuse.core.errors import Busy, InvalidInput, tag_invalid, untag_invalid
from facefuse.diffusion.loop import DenoiseCancelled

log = logging.getLogger("facefuse.triton")


# what Triton 2.51 says when a composing model's process died or stopped, or while the
# supervisor has it unloaded for a reload (facefuse.serving.supervisor)
UNAVAILABLE_MARKERS = (
    "is not healthy",
    "unknown model",
    "is not ready",
    "no available versions",
    "is not found",
)
RETRY_HINT = "retry in a few seconds"


class ModelUnavailable(RuntimeError):
    """A composing model cannot answer now (dead, reloading, or past the BLS timeout)."""

    def __init__(self, model: str, reason: str):
        self.model = model
        super().__init__(f"model '{model}' is unavailable ({reason}); {RETRY_HINT}")


def unavailable_reason(message: str) -> bool:
    return any(marker in message for marker in UNAVAILABLE_MARKERS)


def pb_utils():
    import triton_python_backend_utils  # only importable inside the Python-backend stub

    return triton_python_backend_utils


def get_array(request, name: str) -> np.ndarray | None:
    tensor = pb_utils().get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def get_bytes(request, name: str, required: bool = True) -> bytes | None:
    """The single BYTES element of input ``name`` (shape [1] or [1, 1])."""
    array = get_array(request, name)
    if array is None:
        if required:
            raise InvalidInput(name, "is required")
        return None
    if array.size != 1:
        raise InvalidInput(name, f"must hold exactly one element, got {array.size}")
    value = array.reshape(-1)[0]
    return value if isinstance(value, bytes) else str(value).encode()


def get_text(request, name: str, required: bool = True) -> str | None:
    data = get_bytes(request, name, required)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(name, "must be UTF-8 text") from exc


def get_scalar(request, name: str, default, cast: Callable):
    array = get_array(request, name)
    if array is None:
        return default
    if array.size != 1:
        raise InvalidInput(name, f"must hold exactly one value, got {array.size}")
    return cast(array.reshape(-1)[0])


def text_tensor(name: str, text: str):
    return pb_utils().Tensor(name, np.array([text.encode("utf-8")], dtype=np.object_))


def json_tensor(name: str, payload: dict):
    return text_tensor(name, json.dumps(payload, sort_keys=True))


def error_response(exc: BaseException, model: str):
    pb = pb_utils()
    if isinstance(exc, InvalidInput):
        return pb.InferenceResponse(
            error=pb.TritonError(tag_invalid(str(exc)), pb.TritonError.INVALID_ARG)
        )
    if isinstance(exc, Busy):  # a full bound: the client may retry
        return pb.InferenceResponse(
            error=pb.TritonError(f"{model}: {exc}", pb.TritonError.UNAVAILABLE)
        )
    if isinstance(exc, ModelUnavailable):  # transient: the client may retry
        log.warning("%s: %s", model, exc)
        return pb.InferenceResponse(
            error=pb.TritonError(f"{model}: {exc}", pb.TritonError.UNAVAILABLE)
        )
    if isinstance(exc, DenoiseCancelled):  # the client cancelled: no traceback, not a fault
        log.warning("%s: %s", model, exc)
        code = getattr(pb.TritonError, "CANCELLED", pb.TritonError.UNAVAILABLE)
        return pb.InferenceResponse(error=pb.TritonError(f"{model}: {exc}", code))
    log.exception("%s: request failed", model)
    message = f"{model}: internal error: {type(exc).__name__}: {exc}".splitlines()[0]
    return pb.InferenceResponse(error=pb.TritonError(message))


def respond_each(requests: Sequence, handler: Callable, model: str) -> list:
    """Call ``handler(request) -> InferenceResponse`` per request; errors stay per request."""
    responses = []
    for request in requests:
        try:
            responses.append(handler(request))
        except Exception as exc:  # the boundary: every failure becomes one clean response
            responses.append(error_response(exc, model))
    return responses


# seconds one BLS call may take before the caller gives up on it (None: wait for ever); the
# pipeline models set it from their ``bls_timeout_s`` parameter (set_bls_timeout)
_BLS_TIMEOUT_S: list[float | None] = [None]


def set_bls_timeout(seconds: float | None) -> None:
    if seconds is not None and not (0 < seconds <= 3600):
        raise ValueError(f"bls_timeout_s must be in (0, 3600] seconds, got {seconds}")
    _BLS_TIMEOUT_S[0] = seconds


def exec_with_timeout(request, model: str, timeout_s: float | None):
    """``request.exec()``, abandoned after ``timeout_s`` (ModelUnavailable). The abandoned
    call's thread ends when the callee answers or its process is killed (the supervisor
    kills a hung one)."""
    if timeout_s is None:
        return request.exec()
    box: dict = {}

    def run():
        try:
            box["response"] = request.exec()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"bls-{model}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ModelUnavailable(model, f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["response"]


def bls(
    model: str,
    inputs: dict[str, np.ndarray],
    outputs: Sequence[str],
    timeout_s: float | None = None,
) -> dict[str, np.ndarray]:
    """Call ``model`` synchronously; user errors come back as InvalidInput, a dead, reloading
    or silent callee as ModelUnavailable, others as RuntimeError naming it. ``timeout_s``:
    default the pipeline's ``bls_timeout_s``."""
    pb = pb_utils()
    tensors = [pb.Tensor(name, value) for name, value in inputs.items()]
    request = pb.InferenceRequest(
        model_name=model, inputs=tensors, requested_output_names=list(outputs)
    )
    response = exec_with_timeout(request, model, timeout_s or _BLS_TIMEOUT_S[0])
    if response.has_error():
        message = response.error().message()
        user_message = untag_invalid(message)
        if user_message is not None:
            field, _, expectation = user_message.partition(": ")
            raise InvalidInput(field, expectation)
        if unavailable_reason(message):
            raise ModelUnavailable(model, message.strip().splitlines()[0].rstrip("."))
        raise RuntimeError(f"call to model '{model}' failed: {message}")
    return {name: pb.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}


def bytes_array(data: bytes) -> np.ndarray:
    return np.array([data], dtype=np.object_)


_WATCHING: list[int] = []


def exit_with_parent(period_s: float = 1.0) -> None:
    """End this stub process when its tritonserver is gone. A stub whose server died
    (SIGKILL, a crash) is reparented; its own loop notices, but threads blocked on the dead
    server (a metric or BLS call) keep the process alive for ever, holding memory and shared
    memory. A daemon thread polls the parent pid and calls ``os._exit`` when it changes.
    Idempotent (one watcher per process)."""
    import os

    if _WATCHING:
        return
    parent = os.getppid()
    _WATCHING.append(parent)

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(period_s)
        log.warning("tritonserver (pid %d) is gone: this model process exits", parent)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="facefuse-parent-watch").start()


# Every Python-backend metric call of this process goes through this lock. The stub's metric
# API is not safe across threads: two threads creating the metric of one label set at once
# leave one Metric to be collected while the server still reads its shared memory, and
# tritonserver 2.51 then dies with SIGSEGV in Metric::LoadFromSharedMemory (seen when many
# streams were cancelled at once, each on its own thread).
METRIC_LOCK = threading.RLock()


class TritonMetric:
    """A custom metric family that keeps itself alive next to its metrics (Triton invalidates a
    metric whose ``MetricFamily`` object was garbage-collected): hold this object, not the
    metric. ``kind`` is "counter" or "gauge"; ``labels`` are the default labels. Safe to call
    from any thread (``METRIC_LOCK``); a label set's metric is created once and kept."""

    def __init__(self, name: str, description: str, kind: str = "counter", **labels: str):
        family = pb_utils().MetricFamily
        kinds = {"counter": family.COUNTER, "gauge": family.GAUGE}
        with METRIC_LOCK:
            self.family = family(name=name, description=description, kind=kinds[kind])
        self.labels = labels
        self._metrics: dict[tuple, object] = {}

    def labeled(self, **labels: str):
        merged = {**self.labels, **labels}
        key = tuple(sorted(merged.items()))
        with METRIC_LOCK:
            if key not in self._metrics:
                self._metrics[key] = self.family.Metric(labels=merged)
            return self._metrics[key]

    def increment(self, value: float = 1, **labels: str) -> None:
        with METRIC_LOCK:
            self.labeled(**labels).increment(value)

    def set(self, value: float, **labels: str) -> None:
        with METRIC_LOCK:
            self.labeled(**labels).set(value)
