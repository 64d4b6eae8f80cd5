"""facefuse.client retries what is safe to retry (issue 33): UNAVAILABLE answers, a model
process reported not healthy, connection resets; never a 400 or another 500; within a total
deadline. The real server case is in tests/integration/test_self_healing.py."""

from __future__ import annotations

import asyncio
import random

import pytest
from facefuse.client import NO_RETRY, AsyncClient, Client, ClientError, RetryPolicy, retryable
from facefuse.client.api import Result

from facefuse.core.errors import InvalidInput

UNAVAILABLE = ClientError(
    "facefusion: model 'unet' is unavailable (Stub process 'unet_0_0' is not healthy); "
    "retry in a few seconds",
    "503",
)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (UNAVAILABLE, True),
        (
            ClientError("facefusion: model 'unet' is unavailable ...", "StatusCode.UNAVAILABLE"),
            True,
        ),
        (ClientError("Stub process 'facefusion_0_1' is not healthy.", "500"), True),
        # the supervisor has the pipeline unloaded for a reload
        (ClientError("Request for unknown model: 'facefusion' is not found", "400"), True),
        (ClientError("[Errno 104] Connection reset by peer"), True),
        (ConnectionRefusedError(111, "Connection refused"), True),
        (ClientError("SOURCE_IMAGE: no face found", "400"), False),
        (ClientError("facefusion: internal error: RuntimeError: boom", "500"), False),
        (ClientError("Deadline Exceeded", "StatusCode.DEADLINE_EXCEEDED"), False),
    ],
)
def test_what_is_retried(error, expected):
    assert retryable(error) is expected


def fake_client(monkeypatch, answers, policy):
    client = Client("127.0.0.1:1", "http", timeout_s=30, retry=policy)
    sent = []

    def infer_once(model, inputs, outputs, headers, timeout_s):
        sent.append(timeout_s)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Result(png=b"png", info={})

    monkeypatch.setattr(client, "_infer_once", infer_once)
    monkeypatch.setattr("facefuse.client.api.time.sleep", lambda s: None)
    monkeypatch.setattr(client, "_reconnect", lambda: None)
    return client, sent


def test_unavailable_is_retried_until_it_succeeds(monkeypatch):
    policy = RetryPolicy(attempts=5, rng=random.Random(0))
    client, sent = fake_client(monkeypatch, [UNAVAILABLE, UNAVAILABLE, "ok"], policy)
    result = client.txt2img("a portrait", steps=1)
    assert result.attempts == 3 and client.retries == 2 and len(sent) == 3


def test_bad_input_and_plain_errors_are_not_retried(monkeypatch):
    bad = ClientError("STEPS: must be in 1..100", "400")
    client, sent = fake_client(monkeypatch, [bad, "ok"], RetryPolicy())
    with pytest.raises(ClientError, match="STEPS"):
        client.txt2img("a portrait", steps=1)
    assert len(sent) == 1 and client.retries == 0


def test_attempts_bound_the_retries_and_the_last_error_surfaces(monkeypatch):
    client, sent = fake_client(monkeypatch, [UNAVAILABLE] * 10, RetryPolicy(attempts=3))
    with pytest.raises(ClientError, match="retry in a few seconds"):
        client.txt2img("a portrait", steps=1)
    assert len(sent) == 3


def test_no_retry_policy_shows_the_first_failure(monkeypatch):
    client, sent = fake_client(monkeypatch, [UNAVAILABLE, "ok"], NO_RETRY)
    with pytest.raises(ClientError):
        client.txt2img("a portrait", steps=1)
    assert len(sent) == 1


def test_the_deadline_bounds_the_whole_call(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("facefuse.client.api.time.monotonic", lambda: now[0])
    policy = RetryPolicy(attempts=100, deadline_s=10, backoff_s=2, max_backoff_s=2, jitter=0)
    client, sent = fake_client(monkeypatch, [UNAVAILABLE] * 100, policy)
    monkeypatch.setattr("facefuse.client.api.time.sleep", lambda s: now.__setitem__(0, now[0] + s))
    with pytest.raises(ClientError):
        client.txt2img("a portrait", steps=1)
    assert len(sent) == 5  # at t = 0, 2, 4, 6, 8; the pause after the 5th would pass t = 10
    assert max(sent) <= 10


def test_backoff_doubles_up_to_its_ceiling_with_jitter():
    policy = RetryPolicy(backoff_s=0.5, max_backoff_s=4, jitter=0)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1, 2, 4, 4]
    jittered = RetryPolicy(backoff_s=1, jitter=0.25, rng=random.Random(1))
    assert all(0.75 <= jittered.delay(1) <= 1.25 for _ in range(50))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"attempts": 0}, "retry attempts"),
        ({"deadline_s": 0}, "retry deadline_s"),
        ({"backoff_s": 5, "max_backoff_s": 1}, "retry max_backoff_s"),
        ({"jitter": 1.5}, "retry jitter"),
    ],
)
def test_a_bad_policy_is_refused_with_its_name(kwargs, name):
    with pytest.raises(InvalidInput, match=name):
        RetryPolicy(**kwargs)


def test_async_client_retries_too(monkeypatch):
    answers = [UNAVAILABLE, "ok"]

    class FakeAio:
        async def infer(self, *args, **kwargs):
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return "response"

    async def no_sleep(_):
        return None

    monkeypatch.setattr("facefuse.client.api._result", lambda r: Result(png=b"p", info={}))

    async def main():
        client = AsyncClient("127.0.0.1:1", "http", retry=RetryPolicy(rng=random.Random(0)))
        real = client._client
        client._client = FakeAio()
        monkeypatch.setattr("facefuse.client.api.asyncio.sleep", no_sleep)
        try:
            return client, await client.txt2img("a portrait", steps=1)
        finally:
            await real.close()

    client, result = asyncio.run(main())
    assert result.attempts == 2 and client.retries == 1
