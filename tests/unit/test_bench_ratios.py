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
