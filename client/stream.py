"""Streams of frames to ``facefusion_stream`` over gRPC bidirectional streaming.

:func:`fuse_stream` (sync, a generator) and :func:`fuse_stream_async` (an async generator) send
one START request (A, the instruction and options), then the frames, then END, on one gRPC
stream under one ``sequence_id``, and yield :class:`StreamFrame` results in frame order.

Offline (``live`` False) at most ``max_in_flight`` frames are unanswered at once (the server's
own bound; nothing is dropped and the output has every frame). Live, frames go out as the
caller hands them in (a camera's pace) and the server drops what it cannot serve in time: a
dropped frame comes back with ``rgb`` None and ``dropped`` True.

Frames travel raw (``transport="raw"``: UINT8 [H, W, 3], no encoding cost) or as JPEG
(``"jpeg"``: a tenth of the bytes, for a remote server); the answer comes in the same form.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import queue
import random
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from facefuse.core import contract
from facefuse.core.errors import InvalidInput

TRANSPORTS = ("raw", "jpeg")
_IDS = itertools.count(1)


@dataclass
class StreamFrame:
    """One answered frame: ``rgb`` uint8 HxWx3 (None when dropped), the server's INFO, and
    when it was sent and received (``time.perf_counter()``)."""

    index: int
    rgb: np.ndarray | None
    info: dict
    sent_at: float
    received_at: float

    @property
    def dropped(self) -> bool:
        return self.rgb is None

    @property
    def latency_ms(self) -> float:
        return 1000.0 * (self.received_at - self.sent_at)


def new_stream_id() -> int:
    """A sequence id unlikely to meet another client's (random high bits, a local counter)."""
    return (random.getrandbits(40) << 20 | next(_IDS)) & ((1 << 63) - 1) or 1


def start_tensors(
    source: bytes,
    instruction: str = "",
    live: bool = False,
    face_select: str | None = None,
    **params,
) -> dict[str, np.ndarray]:
    """The START request's tensors, validated as the server validates them; ``params``:
    steps, strength, guidance, expression_source, expression_smile, expression_mouth_open."""
    from facefuse.core.limits import check_fusion_instruction

    if not isinstance(source, bytes) or not source:
        raise InvalidInput(contract.SOURCE_IMAGE.name, "must be non-empty image bytes")
    if face_select is not None and face_select not in ("largest", "all"):
        raise InvalidInput(contract.FACE_SELECT.name, "must be largest or all in a stream")
    tensors = {
        contract.SOURCE_IMAGE.name: contract.SOURCE_IMAGE.scalar(source),
        contract.INSTRUCTION.name: contract.INSTRUCTION.scalar(
            check_fusion_instruction(instruction)
        ),
        contract.LIVE.name: np.array([bool(live)], dtype=np.bool_),
    }
    full = contract.facefusion_request(b"x", b"x", "", face_select=face_select, **params)
    for name in (
        contract.STEPS.name, contract.STRENGTH.name, contract.GUIDANCE.name,
        contract.EXPRESSION_SOURCE.name, contract.EXPRESSION_SMILE.name,
        contract.EXPRESSION_MOUTH_OPEN.name, contract.FACE_SELECT.name,
    ):  # fmt: skip
        if name in full:
            tensors[name] = full[name]
    return tensors


def frame_tensors(rgb: np.ndarray, t: float, transport: str, quality: int = 90) -> dict:
    """One frame's tensors: raw or JPEG, with its time."""
    if transport not in TRANSPORTS:
        raise InvalidInput("transport", f"must be one of {TRANSPORTS}, got {transport!r}")
    rgb = np.asarray(rgb)
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise InvalidInput(contract.FRAME.name, f"must be uint8 [H, W, 3], got {rgb.dtype} "
                           f"{list(rgb.shape)}")  # fmt: skip
    tensors = {contract.FRAME_TIME.name: np.array([float(t)], dtype=np.float64)}
    if transport == "raw":
        tensors[contract.FRAME.name] = np.ascontiguousarray(rgb)
    else:
        import cv2

        bgr = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2BGR)
        _, data = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
        tensors[contract.FRAME_JPEG.name] = np.array([data.tobytes()], dtype=np.object_)
    return tensors


def _inputs(module, tensors: dict) -> list:
    return contract.infer_inputs(module, contract.FACEFUSION_STREAM, tensors)


def _decode(result) -> tuple[np.ndarray | None, dict]:
    info = json.loads(result.as_numpy(contract.INFO.name).reshape(-1)[0])
    raw = result.as_numpy(contract.FRAME.name)
    if raw is not None:
        return raw, info
    jpeg = result.as_numpy(contract.FRAME_JPEG.name)
    if jpeg is None:
        return None, info
    import cv2

    bgr = cv2.imdecode(np.frombuffer(jpeg.reshape(-1)[0], np.uint8), cv2.IMREAD_COLOR)
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), info


def _frames(frames: Iterable) -> Iterator[tuple[np.ndarray, float]]:
    """(rgb, t) pairs from arrays (t: index / 25) or (array, t) pairs."""
    for index, item in enumerate(frames):
        if isinstance(item, tuple):
            yield item[0], float(item[1])
        else:
            yield item, index / 25.0


def _error(error) -> Exception:
    from facefuse.client.api import _client_error

    return _client_error(error)


def fuse_stream(
    url: str,
    source: bytes,
    frames: Iterable,
    instruction: str = "",
    live: bool = False,
    max_in_flight: int = 4,
    transport: str = "raw",
    stream_id: int | None = None,
    timeout_s: float = 120.0,
    jpeg_quality: int = 90,
    **options,
) -> Iterator[StreamFrame]:
    """Fuse ``frames`` (RGB uint8 arrays, or (array, seconds) pairs) with ``source``'s face;
    yields each frame's :class:`StreamFrame` in order. ``options``: :func:`start_tensors`'.
    Raises :class:`~facefuse.client.api.ClientError` on a refused START or a failed frame (a dropped
    live frame is not a failure)."""
    import tritonclient.grpc as grpc

    if not 1 <= int(max_in_flight) <= 64:
        raise InvalidInput("max_in_flight", f"must be in 1..64, got {max_in_flight}")
    start = start_tensors(source, instruction, live=live, **options)
    key = stream_id or new_stream_id()
    answers: queue.Queue = queue.Queue()
    client = grpc.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    slots = threading.BoundedSemaphore(int(max_in_flight))
    sent: dict[str, float] = {}
    stop = threading.Event()
    feeder_error: list[BaseException] = []
    total: list[int] = []

    def send(tensors: dict, request_id: str, **flags) -> None:
        client.async_stream_infer(
            contract.FACEFUSION_STREAM.name, _inputs(grpc, tensors), request_id=request_id,
            sequence_id=key, enable_empty_final_response=False, **flags,
        )  # fmt: skip

    def feed() -> None:
        count = 0
        try:
            for rgb, t in _frames(frames):
                if stop.is_set():
                    return
                tensors = frame_tensors(rgb, t, transport, jpeg_quality)
                if not live:
                    while not slots.acquire(timeout=0.5):
                        if stop.is_set():
                            return
                sent[str(count)] = time.perf_counter()
                send(tensors, str(count))
                count += 1
        except BaseException as exc:  # the caller's iterator failed: end the stream cleanly
            feeder_error.append(exc)
        finally:
            total.append(count)
            if not stop.is_set():
                send({}, "end", sequence_end=True)

    try:
        try:
            send(start, "start", sequence_start=True)
        except Exception as exc:  # the cause (e.g. failed to connect) went to the callback
            with contextlib.suppress(queue.Empty):
                exc = answers.get(timeout=5)[1] or exc
            raise _error(exc) from None
        result, error = answers.get(timeout=timeout_s)
        if error is not None:
            raise _error(error)
        feeder = threading.Thread(target=feed, daemon=True, name="facefuse-stream-feed")
        feeder.start()
        received = 0
        ended = False
        while not (total and received >= total[0] and ended):
            try:
                result, error = answers.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"no answer from the stream in {timeout_s} s") from None
            if error is not None:
                raise _error(error)
            request_id = result.get_response().id
            if request_id == "end":
                ended = True
                continue
            rgb, info = _decode(result)
            if not live:
                slots.release()
            received += 1
            index = int(request_id)
            yield StreamFrame(index, rgb, info, sent.pop(request_id, 0.0), time.perf_counter())
        if feeder_error:
            raise feeder_error[0]
    finally:
        stop.set()
        client.stop_stream(cancel_requests=True)
        client.close()


async def fuse_stream_async(
    url: str,
    source: bytes,
    frames: Iterable,
    instruction: str = "",
    live: bool = False,
    max_in_flight: int = 4,
    transport: str = "raw",
    stream_id: int | None = None,
    timeout_s: float = 120.0,
    jpeg_quality: int = 90,
    **options,
) -> AsyncIterator[StreamFrame]:
    """:func:`fuse_stream` over ``tritonclient.grpc.aio`` (same arguments and results)."""
    import tritonclient.grpc.aio as grpc_aio

    start = start_tensors(source, instruction, live=live, **options)
    key = stream_id or new_stream_id()
    client = grpc_aio.InferenceServerClient(url)
    slots = asyncio.Semaphore(int(max_in_flight))
    sent: dict[str, float] = {}
    model = contract.FACEFUSION_STREAM.name

    def request(tensors, request_id, **flags):
        return {"model_name": model, "inputs": _inputs(grpc_aio, tensors),
                "request_id": request_id, "sequence_id": key,
                "enable_empty_final_response": False, **flags}  # fmt: skip

    started = asyncio.Event()
    total: list[int] = []

    async def requests():
        yield request(start, "start", sequence_start=True)
        await started.wait()
        count = 0
        for rgb, t in _frames(frames):
            if not live:
                await slots.acquire()
            sent[str(count)] = time.perf_counter()
            yield request(frame_tensors(rgb, t, transport, jpeg_quality), str(count))
            count += 1
        total.append(count)
        yield request({}, "end", sequence_end=True)

    answers = client.stream_infer(requests(), stream_timeout=None)
    received, ended = 0, False
    try:
        async for result, error in answers:
            if error is not None:
                raise _error(error)
            request_id = result.get_response().id
            if request_id == "start":
                started.set()
                continue
            if request_id == "end":
                ended = True
                if received >= total[0]:
                    break
                continue
            received += 1
            rgb, info = _decode(result)
            if not live:
                slots.release()
            yield StreamFrame(int(request_id), rgb, info, sent.pop(request_id, 0.0),
                              time.perf_counter())  # fmt: skip
            if ended and total and received >= total[0]:
                break
    finally:
        answers.cancel()
        await client.close()
