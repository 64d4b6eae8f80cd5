"""Repository copies for benchmarks: sources refreshed, exported artefacts never carried over."""

from __future__ import annotations

from pathlib import Path

from facefuse.export.variants import copy_repository_sources, naive_repository


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _source(root: Path) -> Path:
    _write(root / "unet" / "config.pbtxt", 'name: "unet"\ninstance_group [ { count: 2 } ]\n')
    _write(root / "unet" / "1" / "model.py", "# new model.py\n")
    # artefacts of an export into the source tree (another model's)
    _write(root / "unet" / "1" / "model.onnx", "tiny onnx")
    _write(root / "text_encoder" / "1" / "text_encoder_kv.json", '{"hidden_size": 32}')
    _write(root / "facefusion" / "1" / "pipeline.json", '{"image_size": 64}')
    return root


def test_refresh_updates_sources_and_keeps_the_destinations_artefacts(tmp_path):
    source = _source(tmp_path / "src")
    dest = tmp_path / "dest"
    _write(dest / "unet" / "config.pbtxt", "old config")
    _write(dest / "unet" / "1" / "model.onnx", "mid onnx")
    _write(dest / "text_encoder" / "1" / "text_encoder_kv.json", '{"hidden_size": 256}')
    _write(dest / "facefusion" / "1" / "pipeline.json", '{"image_size": 256}')

    copy_repository_sources(source, dest, refresh=True)

    assert "count: 2" in (dest / "unet" / "config.pbtxt").read_text()
    assert (dest / "unet" / "1" / "model.py").read_text() == "# new model.py\n"
    assert (dest / "unet" / "1" / "model.onnx").read_text() == "mid onnx"
    assert "256" in (dest / "text_encoder" / "1" / "text_encoder_kv.json").read_text()
    assert "256" in (dest / "facefusion" / "1" / "pipeline.json").read_text()


def test_fresh_copy_has_no_artefacts_and_naive_copy_drops_batching(tmp_path):
    source = _source(tmp_path / "src")
    dest = copy_repository_sources(source, tmp_path / "dest")
    assert not list(dest.rglob("*.onnx")) and not list(dest.rglob("*.json"))
    naive = naive_repository(source, tmp_path / "naive")
    assert "count: 1" in (naive / "unet" / "config.pbtxt").read_text()
