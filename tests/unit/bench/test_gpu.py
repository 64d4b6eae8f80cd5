"""``facefuse bench gpu``: the GPU measurement of issue 5, dry-run on the CPU."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow  # builds an SD-1.5-shaped UNet: ~30 s
def test_bench_gpu_dry_run_compares_fp16_with_fp32(capsys):
    from facefuse.cli import main

    args = ["bench", "gpu", "--device", "cpu", "--shape", "tiny", "--latent", "16", "--iters", "1"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["median_ms"]) == {"fp32", "fp16"}
    assert report["speedup_fp16"] == report["median_ms"]["fp32"] / report["median_ms"]["fp16"]
    # FP16 really ran (not the FP32 model twice) and stays close to FP32
    assert 0.0 < report["rel_diff_fp16"] < 1e-2
    # no GPU reading on the CPU: the fallback keeps the request and says why
    assert report["fallback_decision"]["variant"] == "fp16"
    assert "unknown" in report["fallback_decision"]["reason"]


@pytest.mark.parametrize(
    ("argv", "field"),
    [(["--latent", "30"], "--latent"), (["--iters", "0"], "--iters")],
)
def test_bench_gpu_rejects_bad_arguments(argv, field, capsys):
    from facefuse.cli import main

    assert main(["bench", "gpu", "--device", "cpu", *argv]) == 2
    assert field in capsys.readouterr().err


def test_bench_gpu_names_the_device_when_cuda_is_missing(capsys):
    import torch

    from facefuse.cli import main

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    assert main(["bench", "gpu", "--iters", "1"]) == 2
    assert "--device" in capsys.readouterr().err
