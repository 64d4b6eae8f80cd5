"""Python client for a facefuse Triton deployment (tritonclient, gRPC or HTTP, sync and async).

Inputs are checked against the same :mod:`facefuse.core.limits` the server enforces before any
bytes are sent; server errors surface as :class:`ClientError` with one clear line.

Retries (:class:`RetryPolicy`): an answer that says "try again" (HTTP 503 / gRPC UNAVAILABLE,
which the pipelines send while the supervisor replaces a dead model process; a model process
reported "not healthy"; a connection refused or reset) is retried with exponential backoff and
jitter until the policy's total deadline. Every request facefuse serves is safe to retry: it
changes nothing on the server, and the fusion default (DDIM inversion) and any request with a
SEED give the same image again. Other errors (400 bad input, 500) are never retried.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from facefuse.core import contract
from facefuse.core.errors import FacefuseError, InvalidInput
from facefuse.core.limits import DEFAULT_LIMITS

PROTOCOLS = ("grpc", "http")
# Header that the Kubernetes manifests hash on to route one prompt template to one replica
# (its prefix cache is per pod); see docs/deploy.md.
TEMPLATE_HEADER = "x-facefuse-template"
DEFAULT_URLS = {"grpc": "127.0.0.1:8001", "http": "127.0.0.1:8000"}
ImageLike = bytes | str | Path


class ClientError(FacefuseError):
    """The server refused or failed a request; ``status`` is the HTTP/gRPC status text."""

    def __init__(self, message: str, status: str | None = None):
        self.status = status
        super().__init__(message if status is None else f"{message} ({status})")


@dataclass
class Result:
    """A generated image (PNG bytes) and the server's INFO JSON; ``attempts``: how many
    requests it took (1 without a retry)."""

    png: bytes
    info: dict
    attempts: int = 1

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.png)
        return path


def read_image(image: ImageLike, field: str) -> bytes:
    """Image bytes from bytes or a file path, within the byte limit."""
    if isinstance(image, (str, Path)):
        path = Path(image)
        if not path.is_file():
            raise InvalidInput(field, f"file not found: {path}")
        image = path.read_bytes()
    if not isinstance(image, bytes) or not image:
        raise InvalidInput(field, "must be non-empty image bytes or a file path")
    if len(image) > DEFAULT_LIMITS.max_image_bytes:
        raise InvalidInput(field, f"must be at most {DEFAULT_LIMITS.max_image_bytes} bytes")
    return image


def fusion_inputs(source, target, instruction, reference_face=None, **params):
    """name -> array of a ``facefusion`` request, validated client-side; ``params`` are
    :func:`facefuse.core.contract.facefusion_request`'s (steps, strength, guidance, seed,
    expression_source, expression_smile, expression_mouth_open, face_select)."""
    reference = (
        None if reference_face is None else read_image(reference_face, contract.REFERENCE_FACE.name)
    )
    return contract.facefusion_request(
        read_image(source, contract.SOURCE_IMAGE.name),
        read_image(target, contract.TARGET_IMAGE.name),
        instruction,
        reference_face=reference,
        **params,
    )


def txt2img_inputs(prompt, steps=None, guidance=None, seed=None):
    """name -> array of a ``txt2img`` request, validated client-side."""
    return contract.txt2img_request(prompt, steps=steps, guidance=guidance, seed=seed)


def _module(protocol: str, aio: bool = False):
    if protocol not in PROTOCOLS:
        raise InvalidInput("protocol", f"must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if protocol == "grpc":
        import tritonclient.grpc as grpc_module
        import tritonclient.grpc.aio as grpc_aio

        return grpc_aio if aio else grpc_module
    import tritonclient.http as http_module
    import tritonclient.http.aio as http_aio

    return http_aio if aio else http_module


def _build(module, model: contract.Model, tensors: dict):
    return contract.infer_inputs(module, model, tensors), contract.requested_outputs(module, model)


def _result(response) -> Result:
    png = response.as_numpy(contract.IMAGE.name).reshape(-1)[0]
    info = json.loads(response.as_numpy(contract.INFO.name).reshape(-1)[0])
    return Result(png=png, info=info)


def _template_headers(template_key: str | None) -> dict | None:
    if template_key is None:
        return None
    if not template_key.isprintable() or not (0 < len(template_key) <= 128):
        raise InvalidInput("template_key", "must be 1..128 printable characters")
    return {TEMPLATE_HEADER: template_key}


def _client_error(exc: Exception) -> ClientError:
    status = getattr(exc, "status", lambda: None)()
    message = getattr(exc, "message", lambda: str(exc))() or str(exc)
    lines = str(message).strip().splitlines() or [type(exc).__name__]
    return ClientError(lines[0], str(status) if status else None)


# statuses and texts that mean "the server cannot answer now, the same request may succeed"
RETRY_STATUSES = ("503", "502", "504", "StatusCode.UNAVAILABLE")
RETRY_TEXTS = (
    "is unavailable",
    "busy, retry",  # a full bound (streams, frames in flight): errors.Busy
    "is not healthy",  # a pipeline instance's own process died (Triton answers 500)
    "unknown model",  # the supervisor has the model unloaded for a reload
    "no available versions",
    "Connection reset",
    "Connection refused",
    "Connection aborted",
    "Broken pipe",
    "Socket closed",
    "failed to connect",
    "connection attempt failed",
)


def retryable(exc: BaseException) -> bool:
    """True for an error that a later identical request may not get (see RetryPolicy)."""
    if isinstance(exc, ClientError):
        status, text = exc.status, str(exc)
    else:
        status = getattr(exc, "status", lambda: None)()
        text = str(getattr(exc, "message", lambda: str(exc))() or exc)
        if isinstance(exc, ConnectionError):  # reset, refused, aborted, broken pipe
            return True
    if status is not None and str(status) in RETRY_STATUSES:
        return True
    # this client only calls the served pipelines, so "unknown model" is a reload in progress
    return any(marker in text for marker in RETRY_TEXTS)


@dataclass(frozen=True)
class RetryPolicy:
    """Retry what is safe to retry. ``deadline_s``: the whole call, retries included, ends by
    then (the last attempt gets what is left); ``attempts``: at most this many requests;
    backoff: ``backoff_s`` doubled per retry up to ``max_backoff_s``, with +-25% jitter."""

    attempts: int = 6
    deadline_s: float = 120.0
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    jitter: float = 0.25
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        checks = {
            "attempts": self.attempts >= 1 and int(self.attempts) == self.attempts,
            "deadline_s": 0 < self.deadline_s <= 86400,
            "backoff_s": 0 <= self.backoff_s <= 600,
            "max_backoff_s": self.backoff_s <= self.max_backoff_s <= 3600,
            "jitter": 0 <= self.jitter < 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise InvalidInput(f"retry {name}", f"out of range: {getattr(self, name)!r}")

    def delay(self, retry: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * 2 ** max(0, retry - 1))
        return max(0.0, base * (1 + self.jitter * (2 * self.rng.random() - 1)))

    def pause_after(self, attempt: int, error: ClientError, deadline: float) -> float | None:
        """Seconds to wait before the next attempt after ``error``, or None to give up (the
        last attempt, an error that is not safe to retry, or no time left before
        ``deadline``, a ``time.monotonic()`` value)."""
        pause = self.delay(attempt)
        if attempt >= self.attempts or not retryable(error) or time.monotonic() + pause >= deadline:
            return None
        return pause


NO_RETRY = RetryPolicy(attempts=1)


class Client:
    """Synchronous client. ``protocol`` is "grpc" (default) or "http"; ``retry``: what to do
    with a "try again" answer (:class:`RetryPolicy`; ``NO_RETRY`` to see every failure).
    ``retries`` counts the retries this client made."""

    def __init__(
        self,
        url: str | None = None,
        protocol: str = "grpc",
        timeout_s: float = 600.0,
        retry: RetryPolicy | None = None,
    ):
        self.protocol = protocol
        self.module = _module(protocol)
        self.url = url or DEFAULT_URLS[protocol]
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self.retries = 0
        self._client = self._connect()

    def _connect(self):
        if self.protocol == "http":
            return self.module.InferenceServerClient(
                self.url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
            )
        return self.module.InferenceServerClient(self.url)

    def _infer_once(self, model, inputs, outputs, headers, timeout_s: float) -> Result:
        kwargs = {"headers": headers}
        if self.protocol == "grpc":
            kwargs["client_timeout"] = timeout_s
        try:
            return _result(self._client.infer(model.name, inputs, outputs=outputs, **kwargs))
        except (
            Exception
        ) as exc:  # tritonclient raises InferenceServerException and transport errors
            raise _client_error(exc) from exc

    def _infer(self, model: contract.Model, tensors: dict, headers: dict | None = None) -> Result:
        inputs, outputs = _build(self.module, model, tensors)
        policy = self.retry
        deadline = time.monotonic() + policy.deadline_s
        attempt = 0
        while True:
            attempt += 1
            left = deadline - time.monotonic()
            try:
                result = self._infer_once(
                    model, inputs, outputs, headers, max(1.0, min(self.timeout_s, left))
                )
                result.attempts = attempt
                return result
            except ClientError as exc:
                pause = policy.pause_after(attempt, exc, deadline)
                if pause is None:
                    raise
                self.retries += 1
                time.sleep(pause)
                if self.protocol == "http" and "onnection" in str(exc):
                    self._reconnect()

    def _reconnect(self) -> None:
        """A reset HTTP connection pool is replaced rather than reused."""
        try:
            self._client.close()
        except Exception:  # noqa: S110 - the old pool is broken anyway
            pass
        self._client = self._connect()

    def fuse(
        self,
        source: ImageLike,
        target: ImageLike,
        instruction: str,
        template_key: str | None = None,
        **params,
    ) -> Result:
        """Fuse ``source``'s face into ``target``; params: steps, strength, guidance, seed,
        expression_source, expression_smile, expression_mouth_open, face_select,
        reference_face (an image like ``source``).

        ``template_key`` names the prompt template; behind the consistent-hash proxy of the
        Kubernetes manifests, requests with the same key reach the same replica's cache."""
        tensors = fusion_inputs(source, target, instruction, **params)
        return self._infer(contract.FACEFUSION, tensors, _template_headers(template_key))

    def txt2img(self, prompt: str, template_key: str | None = None, **params) -> Result:
        """Generate a portrait; params: steps, guidance, seed."""
        tensors = txt2img_inputs(prompt, **params)
        return self._infer(contract.TXT2IMG, tensors, _template_headers(template_key))

    def is_ready(self) -> bool:
        try:
            return bool(self._client.is_server_ready())
        except Exception:
            return False

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient:
    """asyncio client over tritonclient's aio modules; same API as :class:`Client`, awaited
    (the same :class:`RetryPolicy`)."""

    def __init__(
        self, url: str | None = None, protocol: str = "grpc", retry: RetryPolicy | None = None
    ):
        self.protocol = protocol
        self.module = _module(protocol, aio=True)
        self.url = url or DEFAULT_URLS[protocol]
        self.retry = retry or RetryPolicy()
        self.retries = 0
        self._client = self.module.InferenceServerClient(self.url)

    async def _infer(
        self, model: contract.Model, tensors: dict, headers: dict | None = None
    ) -> Result:
        inputs, outputs = _build(self.module, model, tensors)
        policy = self.retry
        deadline = time.monotonic() + policy.deadline_s
        attempt = 0
        while True:
            attempt += 1
            try:
                left = max(1.0, deadline - time.monotonic())
                response = await asyncio.wait_for(
                    self._client.infer(model.name, inputs, outputs=outputs, headers=headers),
                    timeout=left,
                )
                result = _result(response)
                result.attempts = attempt
                return result
            except Exception as exc:
                error = exc if isinstance(exc, ClientError) else _client_error(exc)
                pause = policy.pause_after(attempt, error, deadline)
                if pause is None:
                    raise error from exc
                self.retries += 1
                await asyncio.sleep(pause)

    async def fuse(
        self, source: ImageLike, target: ImageLike, instruction: str, **params
    ) -> Result:
        return await self._infer(
            contract.FACEFUSION, fusion_inputs(source, target, instruction, **params)
        )

    async def txt2img(self, prompt: str, **params) -> Result:
        return await self._infer(contract.TXT2IMG, txt2img_inputs(prompt, **params))

    async def close(self) -> None:
        await self._client.close()
