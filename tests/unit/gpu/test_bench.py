"""``facefuse bench gpu``'s issue-21 sections, dry-run on the CPU (tiny shape, eager)."""

from __future__ import annotations

import json


def test_bench_gpu_reports_batch_scaling_and_img2img_side_by_side(capsys):
    from facefuse.gpu.bench import main

    argv = ["--device", "cpu", "--shape", "tiny", "--latent", "8", "--iters", "1"]
    argv += ["--batches", "1,2", "--concurrency", "2", "--steps", "4", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    table = report["unet_batches"]
    assert set(table) == {"fp32_eager", "fp16_eager"}  # no graphs without CUDA
    assert set(table["fp16_eager"]) == {"1", "2"}
    assert all(row["rows_per_s"] > 0 for row in table["fp32_eager"].values())
    e2e = report["img2img"]
    assert e2e["paths"] == ["diffusers_fp32_eager", "facefuse_fp32_eager"]
    assert e2e["unet_calls"] == 2 and e2e["image"] == 64
    for path in e2e["paths"]:
        assert e2e[path]["single_ms_p50"] > 0 and e2e[path]["batch2_requests_per_s"] > 0
    assert e2e["speedup_single"] > 0
    assert any(line.startswith("[img2img] facefuse vs diffusers") for line in report["verdict"])


def test_bench_gpu_refuses_bad_batches(capsys):
    from facefuse.gpu.bench import main

    assert main(["--device", "cpu", "--shape", "tiny", "--latent", "8", "--batches", "0"]) == 2
    assert "--batches" in capsys.readouterr().err
