"""Stream bounds and the rules for when a stream dies (facefuse.serving.streams), and the
runner's order, bound and live dropping (facefuse.diffusion.stream), without a server."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from facefuse.core.errors import Busy, InvalidInput
from facefuse.diffusion.stream import FrameResult, StreamBusy, StreamRunner, StreamSettings
from facefuse.serving.streams import Stream, StreamLimits, StreamRegistry, StreamsBusy


class SlowSession:
    """A session whose frames take ``delay`` seconds; records what it was handed."""

    def __init__(self, settings: StreamSettings, delay: float = 0.0):
        self.settings, self.delay, self.prepared = settings, delay, []
        self.gate = threading.Event()
        self.gate.set()

    def prepare(self, rgb, t, received):
        self.gate.wait(5)
        time.sleep(self.delay)
        self.prepared.append(int(rgb[0, 0, 0]))
        return type("Work", (), {"index": None, "value": int(rgb[0, 0, 0])})()

    def schedule(self, work, pool):
        pass

    def finish(self, work, wait=True):
        return FrameResult(work.index, np.full((2, 2, 3), work.value, np.uint8), {})


def frame(value: int) -> np.ndarray:
    return np.full((16, 16, 3), value, np.uint8)


def test_runner_answers_in_order_and_bounds_frames_in_flight():
    out = []
    session = SlowSession(StreamSettings(max_in_flight=2))
    session.gate.clear()  # hold the first frame so that two stay in flight
    runner = StreamRunner(session, out.append)
    runner.submit(frame(0), 0.0)
    runner.submit(frame(1), 0.04)
    with pytest.raises(StreamBusy, match="busy, retry"):
        runner.submit(frame(2), 0.08)
    assert isinstance(StreamBusy(2), Busy)
    session.gate.set()
    assert runner.wait_idle(5)
    for i in range(2, 6):
        while True:  # a client waits for an answer when the bound is reached
            try:
                runner.submit(frame(i), i / 25)
                break
            except StreamBusy:
                time.sleep(0.01)
    runner.close()
    assert [r.index for r in out] == list(range(6))
    assert [int(r.rgb[0, 0, 0]) for r in out] == list(range(6))


def test_live_runner_drops_the_oldest_waiting_frame_and_keeps_order():
    out = []
    session = SlowSession(StreamSettings(max_in_flight=2, live=True))
    session.gate.clear()
    runner = StreamRunner(session, out.append)
    for i in range(6):  # frame 0 is held in prepare; the rest arrive faster than served
        runner.submit(frame(i), i / 25)
    session.gate.set()
    runner.close()
    assert [r.index for r in out] == list(range(6))
    dropped = [r.index for r in out if r.info.get("dropped")]
    assert dropped and 5 not in dropped  # the newest frame wins
    assert runner.dropped == len(dropped)
    assert all(r.rgb is not None for r in out if not r.info.get("dropped"))


def test_a_failing_frame_is_that_frames_answer():
    out = []

    class Failing(SlowSession):
        def prepare(self, rgb, t, received):
            if rgb[0, 0, 0] == 1:
                raise InvalidInput("FRAME", "bad frame")
            return super().prepare(rgb, t, received)

    runner = StreamRunner(Failing(StreamSettings()), out.append)
    for i in range(3):
        runner.submit(frame(i), i / 25)
    runner.close()
    assert [r.index for r in out] == [0, 1, 2]
    assert "bad frame" in str(out[1].info["error"]) and out[2].rgb is not None


class FakeRunner:
    def __init__(self):
        self.closed, self.in_flight = False, 0

    def close(self):
        self.closed = True

    def wait_idle(self, timeout=None):
        return True


def test_registry_bounds_streams_and_frees_them():
    closed = []
    registry = StreamRegistry(
        StreamLimits(max_streams=2, idle_timeout_s=0.5), lambda s, why: closed.append(why)
    )
    a = registry.start(1, FakeRunner)
    registry.start(2, FakeRunner)
    with pytest.raises(StreamsBusy, match="busy, retry"):
        registry.start(3, FakeRunner)
    assert registry.get(1) is a and len(registry) == 2
    with pytest.raises(InvalidInput, match="sequence_id"):
        registry.get(99)
    assert registry.close(1, "ended") and a.runner.closed
    registry.start(3, FakeRunner)  # the freed slot is taken
    registry.get(2).runner.in_flight = 1  # a stream with a frame in flight does not idle out
    assert registry.expire(time.monotonic() + 10) == [3]
    registry.get(2).runner.in_flight = 0
    assert registry.expire(time.monotonic() + 10) == [2]
    assert len(registry) == 0 and closed == ["ended", "idle", "idle"]


def test_a_failed_start_frees_its_slot():
    registry = StreamRegistry(StreamLimits(max_streams=1))

    def broken():
        raise InvalidInput("SOURCE_IMAGE", "no face")

    with pytest.raises(InvalidInput):
        registry.start(1, broken)
    registry.start(2, FakeRunner)
    assert len(registry) == 1


def test_end_frees_the_stream_after_its_frames():
    registry = StreamRegistry(StreamLimits())
    registry.start(7, FakeRunner)
    registry.end_after_frames(7)
    deadline = time.monotonic() + 5
    while len(registry) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(registry) == 0


def test_frames_must_keep_their_size_and_limits():
    limits = StreamLimits(max_frame_pixels=100 * 100, max_frames=2)
    stream = Stream(1, FakeRunner())
    stream.check_frame((64, 64, 3), limits, "FRAME")
    with pytest.raises(InvalidInput, match="changed size mid-stream"):
        stream.check_frame((64, 80, 3), limits, "FRAME")
    with pytest.raises(InvalidInput, match="pixels"):
        stream.check_frame((200, 200, 3), limits, "FRAME")
    with pytest.raises(InvalidInput, match="RGB"):
        stream.check_frame((64, 64), limits, "FRAME")
    stream.frames = 2
    with pytest.raises(InvalidInput, match="frames"):
        stream.check_frame((64, 64, 3), limits, "FRAME")


def test_limits_are_validated_from_parameters():
    assert StreamLimits.from_parameters({"max_streams": "3"}).max_streams == 3
    with pytest.raises(ValueError, match="max_streams"):
        StreamLimits.from_parameters({"max_streams": "0"})
    with pytest.raises(ValueError, match="idle_timeout_s"):
        StreamLimits.from_parameters({"idle_timeout_s": "soon"})
    with pytest.raises(InvalidInput, match="refine_every"):
        StreamSettings(refine_every=-1)


def test_a_model_process_exits_when_its_server_is_gone(tmp_path):
    """exit_with_parent: a process whose parent died (reparented) ends itself, as a stub
    whose threads block on a dead tritonserver must."""
    import os
    import subprocess
    import sys
    import time

    child = ("from facefuse.serving.triton_io import exit_with_parent; import time; "
             "exit_with_parent(0.1); time.sleep(120)")  # fmt: skip
    parent = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
              "print(p.pid, flush=True); import time; time.sleep(3)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, 9)
    raise AssertionError("the orphaned process did not exit")
