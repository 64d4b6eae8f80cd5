"""``facefuse fusion-eval`` against a real tritonserver on the tiny model (two sample photos)."""

from __future__ import annotations

import json

import pytest

from facefuse.cli import main
from facefuse.quality.metrics import PSNR_CAP_DB

pytestmark = pytest.mark.integration


def test_fusion_eval_writes_report_and_sheet(server, tmp_path, capsys):
    from facefuse.core.samples import write_samples

    photos = tmp_path / "photos"
    write_samples(photos)  # astronaut and Grace Hopper: pairs A->B and B->A
    out = tmp_path / "out"
    argv = ["fusion-eval", "--sources", str(photos), "--targets", str(photos)]
    argv += ["--url", server.grpc_url, "--steps", "2", "--seed", "3", "--out", str(out)]
    assert main(argv) == 0
    assert "fusion-eval: 2 of 2 pairs evaluated" in capsys.readouterr().out

    report = json.loads((out / "report.json").read_text())
    assert (out / "contact_sheet.png").stat().st_size > 10_000
    summary = report["summary"]
    assert summary["pairs"] == 2 and summary["evaluated"] == 2 and summary["skipped"] == {}
    assert {(p["a"], p["b"]) for p in report["pairs"]} == {
        ("astronaut", "grace_hopper"),
        ("grace_hopper", "astronaut"),
    }
    for variant in ("paste_only", "neutral", "smile"):
        figures = summary[variant]
        assert figures["n"] == 2
        assert 0.0 <= figures["face_found_share"] <= 1.0
        assert 0.0 <= figures["nearer_a_share"] <= 1.0
        assert 0.0 < figures["median_distance_a"] < 2.0
        assert 0.0 < figures["median_distance_b"] < 2.0
        assert 20.0 < figures["psnr_outside_min_db"] <= figures["psnr_outside_median_db"]
        assert figures["psnr_outside_median_db"] < PSNR_CAP_DB  # the outer ramp changes
    assert summary["paste_only"]["nearer_a_share"] == 1.0  # A's face pasted, no diffusion
    effect = summary["instruction_effect"]
    assert effect["n"] == 2 and 0.5 < effect["median_smile_over_neutral"] < 2.0
    assert summary["latency_ms"]["requests"] == 4 and summary["latency_ms"]["median"] > 0
    assert report["config"]["params"] == {"steps": 2, "seed": 3}
    for pair in report["pairs"]:
        assert pair["neutral"]["measured_at"] in ("detected face", "B's face box")
        assert 0.0 <= pair["neutral"]["iou"] <= 1.0
