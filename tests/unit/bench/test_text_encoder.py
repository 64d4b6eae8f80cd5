"""The cost model of ``facefuse bench text-encoder``'s ``suffix-cost`` workload."""

from __future__ import annotations

import time

import numpy as np
import pytest

from facefuse.bench.text_encoder import (
    SUFFIX_ROWS,
    _suffix_cost,
    fit_suffix_cost,
    max_floor_rows,
    speedup_ceiling,
    summarise_suffix_cost,
)


def test_fit_recovers_floor_and_per_row_cost():
    rows = [1, 13, 29, 45, 61]
    floor, per_row = fit_suffix_cost(rows, [17.0 + 2.5 * r for r in rows])
    assert floor == pytest.approx(17.0) and per_row == pytest.approx(2.5)


def test_ceiling_is_the_row_ratio_without_floor_and_falls_with_it():
    assert speedup_ceiling(0.0, 2.0, 48) == pytest.approx(77 / 29)
    # a floor of exactly max_floor_rows rows of compute gives exactly the target
    assert max_floor_rows(2.5, 48) == pytest.approx(3.0)
    assert speedup_ceiling(3.0 * 2.0, 2.0, 48) == pytest.approx(2.5)
    assert speedup_ceiling(17.0, 2.7, 48) < 2.5
    # a batch shares one floor: the ceiling climbs back towards 77/29
    by_batch = [speedup_ceiling(18.0, 1.87, 48, batch=b) for b in (1, 2, 4, 64)]
    assert by_batch == sorted(by_batch) and by_batch[-1] < 77 / 29
    with pytest.raises(ValueError, match="prefix"):
        speedup_ceiling(1.0, 1.0, 77)


class _RecordingRuntime:
    """Stands in for KvRuntime: checks the shapes the cost workload feeds."""

    def __init__(self) -> None:
        self.suffix_calls: list[tuple[int, int]] = []

    def prefix(self, ids):
        class Out:
            kv = np.zeros((1, 2, 2, ids.shape[1], 4), np.float32)

        return Out()

    def suffix(self, ids, past_kv):
        assert ids.shape[1] + past_kv.shape[3] == 77  # the suffix ends at position 76
        self.suffix_calls.append((ids.shape[1], past_kv.shape[3]))
        time.sleep(2e-4 * ids.shape[1])  # costs grow with rows, so the fit has a slope


def test_suffix_cost_times_every_length_with_its_prefix():
    runtime = _RecordingRuntime()
    cost = _suffix_cost(runtime, np.random.default_rng(0), iters=3)
    assert sorted(cost["median_ms_by_rows"]) == sorted(SUFFIX_ROWS)
    assert len(runtime.suffix_calls) == 4 * len(SUFFIX_ROWS)  # 3 timed rounds + 1 warm-up
    assert {rows for rows, _ in runtime.suffix_calls} == set(SUFFIX_ROWS)
    assert cost["per_row_ms"] > 0
    assert cost["ceiling_template_48"] == pytest.approx(
        speedup_ceiling(cost["floor_ms"], cost["per_row_ms"], 48)
    )


def test_a_flat_fit_reports_no_ceiling_instead_of_failing():
    # the tiny model's suffix costs ~1 ms at any length: noise can tilt the fit downwards
    cost = summarise_suffix_cost({1: 1.02, 13: 1.01, 29: 1.00, 45: 1.00, 61: 0.99})
    assert cost["per_row_ms"] < 0
    assert cost["ceiling_template_48"] is None and cost["floor_in_rows"] is None
