"""Python client for a facefuse Triton deployment (tritonclient, gRPC or HTTP, sync and async).

Inputs are checked against the same :mod:`facefuse.core.limits` the server enforces before any
bytes are sent; server errors surface as :class:`ClientError` with one clear line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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
    """A generated image (PNG bytes) and the server's INFO JSON."""

    png: bytes
    info: dict

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


def fusion_inputs(source, target, instruction, steps=None, strength=None, guidance=None, seed=None):
    """name -> array of a ``facefusion`` request, validated client-side."""
    return contract.facefusion_request(
        read_image(source, contract.SOURCE_IMAGE.name),
        read_image(target, contract.TARGET_IMAGE.name),
        instruction,
        steps=steps,
        strength=strength,
        guidance=guidance,
        seed=seed,
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
    return ClientError(str(message).strip().splitlines()[0], str(status) if status else None)


class Client:
    """Synchronous client. ``protocol`` is "grpc" (default) or "http"."""

    def __init__(self, url: str | None = None, protocol: str = "grpc", timeout_s: float = 600.0):
        self.protocol = protocol
        self.module = _module(protocol)
        self.url = url or DEFAULT_URLS[protocol]
        self.timeout_s = timeout_s
        if protocol == "http":
            self._client = self.module.InferenceServerClient(
                self.url, connection_timeout=timeout_s, network_timeout=timeout_s
            )
        else:
            self._client = self.module.InferenceServerClient(self.url)

    def _infer(self, model: contract.Model, tensors: dict, headers: dict | None = None) -> Result:
        inputs, outputs = _build(self.module, model, tensors)
        kwargs = {"headers": headers}
        if self.protocol == "grpc":
            kwargs["client_timeout"] = self.timeout_s
        try:
            return _result(self._client.infer(model.name, inputs, outputs=outputs, **kwargs))
        except (
            Exception
        ) as exc:  # tritonclient raises InferenceServerException and transport errors
            raise _client_error(exc) from exc

    def fuse(
        self,
        source: ImageLike,
        target: ImageLike,
        instruction: str,
        template_key: str | None = None,
        **params,
    ) -> Result:
        """Fuse ``source``'s face into ``target``; params: steps, strength, guidance, seed.

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
    """asyncio client over tritonclient's aio modules; same API as :class:`Client`, awaited."""

    def __init__(self, url: str | None = None, protocol: str = "grpc"):
        self.protocol = protocol
        self.module = _module(protocol, aio=True)
        self.url = url or DEFAULT_URLS[protocol]
        self._client = self.module.InferenceServerClient(self.url)

    async def _infer(
        self, model: contract.Model, tensors: dict, headers: dict | None = None
    ) -> Result:
        inputs, outputs = _build(self.module, model, tensors)
        try:
            return _result(
                await self._client.infer(model.name, inputs, outputs=outputs, headers=headers)
            )
        except Exception as exc:
            raise _client_error(exc) from exc

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
