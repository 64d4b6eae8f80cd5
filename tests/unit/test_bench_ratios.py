"""The headline ratios of ``facefuse bench e2e``."""

from __future__ import annotations


def test_bench_ratios_prefer_the_paired_overhead():
    from facefuse.bench.e2e import ratios

    results = {
        "facefuse": {"1": {"p50_ms": 1200.0}, "4": {"requests_per_s": 0.6}},
        "baseline-b": {"4": {"requests_per_s": 0.2}},
        "in-process": {"1": {"p50_ms": 1000.0}},
    }
    unpaired = ratios(results)
    assert unpaired["requests/s vs baseline B, c=4"] == 3.0
    assert unpaired["Triton overhead, % of end-to-end (c=1 p50)"] == 16.7
    paired = ratios(results, {"overhead_ms": 30.0, "overhead_pct": 2.5})
    assert paired["Triton overhead, % of end-to-end (c=1, paired median)"] == 2.5
    assert not any(key.endswith("(c=1 p50)") for key in paired)
