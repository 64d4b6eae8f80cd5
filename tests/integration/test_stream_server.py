"""facefusion_stream through a real tritonserver: frames in order, raw and JPEG, a plain swap
needs no instruction, bad input answered naming the field while the stream goes on, and every
stream's state freed (the open-streams gauge back to 0)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from facefuse.client.api import ClientError
from facefuse.client.stream import fuse_stream, fuse_stream_async, start_tensors

from facefuse.core import contract
from facefuse.core.metrics import STREAMS_OPEN, sample_total, scrape


@pytest.fixture(scope="module")
def clip(sample_images):
    """Eight frames of the astronaut panning slowly (B), and the source photo (A)."""
    from facefuse.face.imageio import decode_image

    source, target = sample_images
    rgb = decode_image(target, "TARGET_IMAGE")  # 512 x 512
    frames = [np.ascontiguousarray(np.roll(rgb, 2 * i, axis=1)) for i in range(8)]
    return source, frames


def open_streams(server) -> float:
    return sample_total(scrape(server.metrics_url), STREAMS_OPEN)


def wait_closed(server, timeout=20.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if open_streams(server) == 0:
            return 0.0
        time.sleep(0.2)
    return open_streams(server)


@pytest.mark.parametrize("transport", ["raw", "jpeg"])
def test_a_stream_fuses_every_frame_in_order(server, clip, transport):
    source, frames = clip
    results = list(fuse_stream(server.grpc_url, source, frames, transport=transport))
    assert [r.index for r in results] == list(range(len(frames)))
    for result, original in zip(results, frames):
        assert result.rgb.shape == original.shape and result.info["faces_found"] == 1
    changed = np.abs(results[0].rgb.astype(int) - frames[0].astype(int)).max(axis=2) > 8
    x0, y0, x1, y1 = results[0].info["faces"][0]["box"]
    assert changed[max(y0, 0) : y1, max(x0, 0) : x1].mean() > 0.05  # A's face is in B's place
    assert changed.mean() < 0.5  # and the rest is B's
    assert results[1].info["faces"][0]["key"] is False  # key frames: diffusion reused
    assert wait_closed(server) == 0


def test_a_frame_without_a_face_passes_through_unchanged(server, clip):
    source, frames = clip
    blank = np.full_like(frames[0], 90)
    results = list(fuse_stream(server.grpc_url, source, [frames[0], blank, frames[1]]))
    assert results[1].info["faces_found"] == 0
    assert np.array_equal(results[1].rgb, blank)
    assert results[2].info["faces_found"] == 1


def test_the_async_client_streams_too(server, clip):
    import asyncio

    source, frames = clip

    async def run():
        return [r async for r in fuse_stream_async(server.grpc_url, source, frames[:4])]

    results = asyncio.run(run())
    assert [r.index for r in results] == [0, 1, 2, 3]


def test_bad_input_is_answered_naming_the_field(server, clip):
    source, frames = clip
    with pytest.raises(ClientError, match="SOURCE_IMAGE"):
        list(fuse_stream(server.grpc_url, frames[0].tobytes()[:100], frames[:2]))
    with pytest.raises(ClientError, match="FRAME"):
        changing = [frames[0], frames[1][:200]]
        list(fuse_stream(server.grpc_url, source, changing))
    assert wait_closed(server) == 0
    # a frame for a stream that was never started
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers = []
    client.start_stream(callback=lambda result, error: answers.append(error))
    tensors = {contract.FRAME.name: frames[0]}
    inputs = contract.infer_inputs(grpcclient, contract.FACEFUSION_STREAM, tensors)
    client.async_stream_infer("facefusion_stream", inputs, request_id="x", sequence_id=424242)
    deadline = time.monotonic() + 20
    while not answers and time.monotonic() < deadline:
        time.sleep(0.05)
    client.stop_stream()
    assert answers and "sequence_id" in str(answers[0])
    # and the server keeps serving
    assert len(list(fuse_stream(server.grpc_url, source, frames[:2]))) == 2


def test_a_client_that_vanishes_mid_stream_frees_its_state(server, clip):
    source, frames = clip
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: None)
    start = contract.infer_inputs(grpcclient, contract.FACEFUSION_STREAM, start_tensors(source))
    client.async_stream_infer("facefusion_stream", start, sequence_id=777, sequence_start=True)
    for frame in frames[:3]:
        inputs = contract.infer_inputs(
            grpcclient, contract.FACEFUSION_STREAM, {contract.FRAME.name: frame}
        )
        client.async_stream_infer("facefusion_stream", inputs, sequence_id=777)
    time.sleep(1.0)
    client.stop_stream(cancel_requests=True)  # no END: the client is gone
    client.close()
    # freed when the next answer cannot be delivered, or after the idle timeout at the latest
    assert wait_closed(server, timeout=60) == 0


def test_many_streams_cancelled_at_once_leave_the_server_serving(server, clip):
    """Streams abandoned together, each freed on its own thread, create and bump the same
    metrics at once: once a SIGSEGV of tritonserver (Metric::LoadFromSharedMemory), now
    serialised (triton_io.METRIC_LOCK). The server answers afterwards and every stream is
    freed."""
    import threading

    source, frames = clip

    def abandon(key: int, started: threading.Barrier) -> None:
        answers: list = []
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.start_stream(callback=lambda result, error: answers.append(error))
        send = lambda tensors, **flags: client.async_stream_infer(  # noqa: E731
            "facefusion_stream", contract.infer_inputs(grpcclient, contract.FACEFUSION_STREAM,
            tensors), sequence_id=key, **flags)  # fmt: skip
        send(start_tensors(source), sequence_start=True)
        for frame in frames[:6]:
            send({contract.FRAME.name: frame})
        deadline = time.monotonic() + 60
        while len(answers) < 2 and time.monotonic() < deadline:  # START and a frame answered
            time.sleep(0.05)
        started.wait(timeout=90)
        client.stop_stream(cancel_requests=True)  # all together, frames still in flight
        client.close()

    for round_ in range(3):
        started = threading.Barrier(3)
        threads = [threading.Thread(target=abandon, args=(9000 + 10 * round_ + i, started))
                   for i in range(3)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert grpcclient.InferenceServerClient(server.grpc_url).is_server_live()
    assert wait_closed(server, timeout=60) == 0  # every abandoned stream freed
    assert len(list(fuse_stream(server.grpc_url, source, frames[:2]))) == 2
