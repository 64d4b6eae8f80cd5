"""The trade sweep: repository copies with one config edited each, and its table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from facefuse.export import configs

from facefuse.bench.trades import TRADES, Trade, main, markdown, row, variant_repository
from facefuse.core.errors import InvalidInput

SOURCE = Path(__file__).resolve().parents[3] / "model_repository"


def test_a_trade_edits_only_its_copy_and_links_the_weights(tmp_path):
    source = tmp_path / "src"
    models = ("facefusion", "face_analyzer", "unet", "unet_deep", "unet_shallow")
    for model in (*models, "vae_encoder", "vae_decoder"):
        (source / model / "1").mkdir(parents=True)
        (source / model / "config.pbtxt").write_text((SOURCE / model / "config.pbtxt").read_text())
    (source / "unet" / "1" / "model.onnx").write_bytes(b"weights")
    trade = Trade(
        "t",
        {"deep_cache_interval": "3"},
        {"feather": "0.3"},
        {"onnx_file": "model.onnx"},
        {"runtime": "onnxruntime"},
    )
    copy = variant_repository(source, tmp_path / "copy", trade)
    assert configs.get_parameter(configs.read(copy / "facefusion" / "config.pbtxt"),
                                 "deep_cache_interval") == "3"  # fmt: skip
    assert configs.get_parameter(configs.read(copy / "face_analyzer" / "config.pbtxt"),
                                 "feather") == "0.3"  # fmt: skip
    for model in ("unet", "unet_deep", "unet_shallow"):
        assert configs.get_parameter(configs.read(copy / model / "config.pbtxt"),
                                     "onnx_file") == "model.onnx"  # fmt: skip
    for model in ("vae_encoder", "vae_decoder"):
        assert configs.get_parameter(configs.read(copy / model / "config.pbtxt"),
                                     "runtime") == "onnxruntime"  # fmt: skip
    assert configs.get_parameter(configs.read(source / "vae_decoder" / "config.pbtxt"),
                                 "runtime") == "openvino"  # fmt: skip
    # the source repository is untouched; the weights are the same file, not a copy
    assert configs.get_parameter(configs.read(source / "unet" / "config.pbtxt"),
                                 "onnx_file") == "model.int8.onnx"  # fmt: skip
    assert (copy / "unet/1/model.onnx").stat().st_ino == (
        source / "unet/1/model.onnx"
    ).stat().st_ino


def test_every_trade_parameter_exists_in_the_shipped_configs():
    for trade in TRADES:
        for model, params in (("facefusion", trade.pipeline), ("face_analyzer", trade.analyzer)):
            config = configs.read(SOURCE / model / "config.pbtxt")
            for key in params:
                assert key in config.parameters, f"{trade.name}: {model} has no {key}"


def test_rows_take_the_worse_of_the_two_instructions_and_render():
    side = {"face_found_share": 1.0, "nearer_a_share": 0.9, "median_distance_a": 0.4,
            "psnr_outside_min_db": 45.0}  # fmt: skip
    report = {
        "summary": {
            "neutral": side,
            "smile": {**side, "nearer_a_share": 0.8, "median_distance_a": 0.5},
            "instruction_effect": {"smile_wider_share": 0.75, "median_smile_over_neutral": 1.05},
            "latency_ms": {"median": 512.0},
            "paste_only": {"median_distance_a": 0.38},
        },
        "config": {"served_info": {"unet_calls": 10, "shallow_calls": 6}},
    }
    r = row(Trade("base"), report)
    assert r["nearer A"] == 0.8 and r["median d(A)"] == 0.5 and r["served"]["shallow_calls"] == 6
    table = markdown([r])
    assert "| base | 100% | 80% | 0.500 | 75% | 1.050 | 45.0 | 512 |" in table
    json.dumps(r)  # JSON-safe


def test_unknown_trade_names_are_refused(tmp_path):
    with pytest.raises(InvalidInput, match="--only"):
        main(["--ids-file", str(tmp_path / "ids"), "--only", "nope", "--out", str(tmp_path)])
