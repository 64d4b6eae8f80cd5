"""PartsRunner: row slices run at once give the same arrays as one forward, in row order."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from facefuse.runtime.sessions import PartsRunner


def _forward_recording(seen: list):
    def forward(feeds):
        seen.append((threading.current_thread().name, len(feeds["x"])))
        x, t = feeds["x"], feeds["t"]
        return [x * 2.0 + t[:, None], x.sum(axis=1)]  # row-independent, two outputs

    return forward


@pytest.mark.parametrize("rows, parts", [(1, 2), (2, 2), (5, 2), (8, 3), (2, 4)])
def test_parts_equal_one_forward_in_row_order(rows, parts):
    rng = np.random.default_rng(rows)
    feeds = {"x": rng.standard_normal((rows, 3)), "t": np.arange(rows, dtype=np.float64)}
    whole = _forward_recording([])(feeds)
    seen: list = []
    runner = PartsRunner(_forward_recording(seen), parts)
    got = runner(feeds)
    runner.close()
    assert len(got) == 2
    for expected, actual in zip(whole, got):
        np.testing.assert_array_equal(actual, expected)
    assert sorted(n for _, n in seen) == sorted(
        np.diff(np.linspace(0, rows, min(parts, rows) + 1).astype(int)).tolist()
    )
    if min(parts, rows) == 1:  # one part: the caller's thread, no pool
        assert seen == [(threading.current_thread().name, rows)]
    else:
        assert all(name.startswith("ort-part") for name, _ in seen)


def test_parts_run_concurrently():
    """Two slices wait for each other at a barrier: they can only both pass if concurrent."""
    barrier = threading.Barrier(2, timeout=10)

    def forward(feeds):
        barrier.wait()
        return [feeds["x"] + 1]

    runner = PartsRunner(forward, 2)
    out = runner({"x": np.zeros((4, 1))})
    runner.close()
    np.testing.assert_array_equal(out[0], np.ones((4, 1)))


def test_parts_must_be_positive():
    with pytest.raises(ValueError, match="parts must be >= 1"):
        PartsRunner(lambda feeds: [], 0)


def test_threads_per_part_shares_the_cores_unless_set():
    from facefuse.runtime.sessions import threads_per_part

    assert threads_per_part(0, 2, cores=2) == 1
    assert threads_per_part(0, 2, cores=16) == 8
    assert threads_per_part(0, 4, cores=2) == 1  # never 0 threads
    assert threads_per_part(3, 2, cores=16) == 3  # an explicit count wins
    assert threads_per_part(0, 1, cores=16) == 0  # one part: ORT's own default (all cores)
    assert threads_per_part(0, 2) >= 1  # this machine's cores


@pytest.mark.parametrize("raw", ["0", "-2", "two", ""])
def test_parallel_runs_parameter_refused_with_its_name(raw):
    from facefuse.core.errors import ModelLoadError
    from facefuse.serving.triton_onnx import int_parameter

    with pytest.raises(
        ModelLoadError, match=r"unet: parameter parallel_runs must be an integer >= 1"
    ):
        int_parameter({"parallel_runs": raw}, "parallel_runs", 1, 1, "unet")


def test_int_parameter_default_and_value():
    from facefuse.serving.triton_onnx import int_parameter

    assert int_parameter({}, "parallel_runs", 1, 1, "unet") == 1
    assert int_parameter({"intra_op_threads": "0"}, "intra_op_threads", 0, 0, "unet") == 0
    assert int_parameter({"parallel_runs": "2"}, "parallel_runs", 1, 1, "unet") == 2
