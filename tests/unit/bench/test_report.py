"""``facefuse bench report``: ratios gathered from the benchmarks' JSON, nothing invented."""

from __future__ import annotations

import json

import pytest

from facefuse.bench.report import collect, markdown
from facefuse.cli import main
from facefuse.core.errors import InvalidInput


def _reports(folder):
    folder.mkdir()
    e2e = {
        "model": "faces",
        "ratios": {"p50 speed-up vs baseline A, c=1": 6.5, "requests/s vs baseline B, c=4": 3.9},
        "results": {"facefuse": {"4": {"unet_rows_per_exec": 3.2}}},
    }
    (folder / "e2e-faces.json").write_text(json.dumps(e2e))
    unet = {"verdict": ["[sd15 unet] ort-int8 vs ORT fp32: x1.35 (target x1.5: no)", "other"]}
    (folder / "bench-unet-x.json").write_text(json.dumps(unet))
    return folder


def test_every_ratio_keeps_its_baseline_target_command_and_file(tmp_path):
    rows = collect(_reports(tmp_path / "r"))
    assert [(r.figure, r.value, r.met) for r in rows] == [
        ("end-to-end p50 speed-up, 1 client", 6.5, "yes"),
        ("requests/s, 4 clients", 3.9, "no"),
        ("UNet rows per execution, 4 clients", 3.2, "yes"),
        ("ort-int8", 1.35, "no"),
    ]
    assert rows[0].command == "facefuse bench e2e --model faces"
    assert rows[3].baseline == "ORT fp32" and rows[3].source == "bench-unet-x.json"
    assert "| requests/s, 4 clients | faces | 3.90 |" in markdown(rows)


def test_cli_writes_three_files_and_refuses_an_empty_folder(tmp_path):
    out = tmp_path / "out" / "summary"
    assert (
        main(["bench", "report", "--reports", str(_reports(tmp_path / "r")), "--out", str(out)])
        == 0
    )
    for suffix in (".md", ".json", ".png"):
        assert out.with_suffix(suffix).stat().st_size > 0
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInput, match="--reports"):
        import argparse

        from facefuse.bench.report import run

        run(argparse.Namespace(reports=tmp_path / "empty", out=out))
