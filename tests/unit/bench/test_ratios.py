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


def _round(a_p50: float, facefuse_p50: float, overhead_ms: float, failures: int = 0) -> dict:
    from facefuse.bench.e2e import ratios

    results = {
        "baseline-a": {"1": {"p50_ms": a_p50, "failures": 0}},
        "facefuse": {"1": {"p50_ms": facefuse_p50, "failures": failures}},
    }
    overhead = {"overhead_ms": overhead_ms, "overhead_pct": 100 * overhead_ms / facefuse_p50}
    return {"results": results, "overhead_paired": overhead, "ratios": ratios(results, overhead)}


def test_bench_rounds_take_the_median_of_per_round_ratios():
    """A ratio is only taken within a round; the headline is the median over rounds, which
    differs from the ratio of the median cells when the rounds' speeds move apart."""
    from facefuse.bench.e2e import combine_rounds

    rounds = [
        _round(4000.0, 1000.0, 40.0),
        _round(3000.0, 1000.0, 10.0),
        _round(6000.0, 2000.0, 20.0, failures=1),
    ]
    results, headline, overhead = combine_rounds(rounds)
    assert results["facefuse"]["1"]["failures"] == 1  # a count is summed, never a median
    assert results["baseline-a"]["1"]["p50_ms"] == 4000.0
    assert results["facefuse"]["1"]["p50_ms"] == 1000.0
    assert headline["p50 speed-up vs baseline A, c=1"] == 3.0  # median of 4.0, 3.0, 3.0
    assert overhead["overhead_ms"] == 20.0


def test_bench_one_round_is_reported_unchanged():
    from facefuse.bench.e2e import combine_rounds

    only = _round(3333.3, 777.7, 12.3)
    results, headline, overhead = combine_rounds([only])
    assert (results, headline, overhead) == (
        only["results"],
        only["ratios"],
        only["overhead_paired"],
    )


def test_bench_e2e_rejects_rounds_under_one(capsys):
    from facefuse.cli import main

    assert main(["bench", "e2e", "--rounds", "0"]) == 2
    assert "--rounds" in capsys.readouterr().err


def test_bench_unet_parallel_runs_match_one_run(tiny_repository):
    """The parallel-runs part times both ways on the same rows. fp32 slices equal one run; the
    dynamic INT8 graph quantises activations per tensor, so a slice's scale differs from the
    whole batch's and outputs move by quantisation noise (~0.02 here), far below the O(1)
    error of rows put back in the wrong order."""
    from argparse import Namespace

    from facefuse.bench.unet import PARTS_BATCHES, bench_parts

    args = Namespace(threads=2, parallel_runs=2, iters=1, latent=32, seed=0, e2e_model="tiny")
    report = bench_parts(args, lambda _: None, tiny_repository / "unet" / "1")
    assert sorted(report["runs"]) == sorted(
        f"{p} batch {b}" for p in ("fp32", "int8") for b in PARTS_BATCHES
    )
    for key, run in report["runs"].items():
        assert run["max_abs_diff"] <= (1e-5 if key.startswith("fp32") else 0.1), key
        assert run["one_run"]["n"] == run["parallel_runs"]["n"] == 1


def test_bench_unet_rejects_parallel_runs_under_one(capsys):
    from facefuse.cli import main

    assert main(["bench", "unet", "--skip-sd15", "--parallel-runs", "0"]) == 2
    assert "--parallel-runs" in capsys.readouterr().err


def test_bench_unet_end_to_end_times_the_served_config_and_its_like_for_like_baseline(
    tiny_repository,
):
    """With parallel runs, the end-to-end part adds the served default (INT8 UNet rows in
    slices) and the fp32 DDIM-50 baseline run in the same slices, and reports their ratio."""
    from argparse import Namespace

    from facefuse.bench.unet import BASELINE, SERVED, bench_e2e

    args = Namespace(threads=2, parallel_runs=2, e2e_iters=1, seed=0, e2e_model="tiny")
    report = bench_e2e(args, lambda _: None, tiny_repository)
    served, baseline = report["configs"][SERVED], report["configs"][BASELINE]
    assert served["unet_calls"] < baseline["unet_calls"]
    assert report["best"] != BASELINE and "cfg-trunc" not in report["best"]
    same = report["like_for_like"]
    assert same["baseline"] == "fp32 ddim-50 2 runs" and same["candidate"] == SERVED
    assert same["end_to_end"] > 0 and SERVED in report["ratios"]


def test_the_supervisor_is_compared_with_the_same_server_unsupervised():
    from facefuse.bench.e2e import CONTENDERS, ratios

    assert "supervised" in CONTENDERS
    results = {
        "facefuse": {"1": {"p50_ms": 600.0, "requests_per_s": 1.6}, "4": {"p50_ms": 1400.0}},
        "supervised": {"1": {"p50_ms": 630.0, "requests_per_s": 1.5}, "4": {"p50_ms": 1330.0}},
    }
    out = ratios(results)
    assert out["p50 latency, supervised / facefuse, c=1"] == 1.05
    assert out["requests/s, supervised / facefuse, c=1"] == 0.938
    assert out["p50 latency, supervised / facefuse, c=4"] == 0.95
    assert "requests/s, supervised / facefuse, c=4" not in out  # no figure, no ratio
    assert not any("supervised" in key for key in ratios({"facefuse": results["facefuse"]}))


def test_a_change_is_compared_with_the_build_before_it():
    from facefuse.bench.e2e import CONTENDERS, ratios

    assert "previous" in CONTENDERS
    results = {"facefuse": {"1": {"p50_ms": 660.0}}, "previous": {"1": {"p50_ms": 600.0}}}
    assert ratios(results)["p50 latency, facefuse / previous, c=1"] == 1.1


def test_the_previous_contender_needs_an_exported_checkout(tmp_path, capsys):
    from facefuse.cli import main

    args = ["bench", "e2e", "--contenders", "previous", "--previous", str(tmp_path)]
    assert main(args) == 2
    assert "--previous" in capsys.readouterr().err
