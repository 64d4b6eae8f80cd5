"""Repository copies for benchmarks: sources refreshed, exported artefacts never carried over."""

from __future__ import annotations

from pathlib import Path

from facefuse.export.configs import get_parameter, parse
from facefuse.export.variants import copy_repository_sources, naive_repository

REPOSITORY = Path(__file__).resolve().parents[3] / "model_repository"


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


def test_naive_copy_is_baseline_b_fp32_ddim_no_compression_no_cache(tmp_path):
    """From the shipped configs: the served default is INT8; baseline B must run fp32."""
    source = copy_repository_sources(REPOSITORY, tmp_path / "src")
    unet = parse((source / "unet" / "config.pbtxt").read_text())
    assert get_parameter(unet, "onnx_file") == "model.int8.onnx"
    naive = naive_repository(source, tmp_path / "naive")

    def config(model):
        return parse((naive / model / "config.pbtxt").read_text())

    assert get_parameter(config("unet"), "onnx_file") == "model.onnx"
    assert get_parameter(unet, "parallel_runs") == "2"  # facefuse's slices; B runs one forward
    assert get_parameter(config("unet"), "parallel_runs") == "1"
    assert not config("unet").HasField("dynamic_batching")
    assert get_parameter(config("facefusion"), "scheduler") == "ddim"
    assert get_parameter(config("facefusion"), "default_steps") == "50"
    # facefuse's default inverts the composite (DDIM inversion); B is plain img2img
    shipped = parse((source / "facefusion" / "config.pbtxt").read_text())
    assert get_parameter(shipped, "inversion") == "true"
    assert get_parameter(config("facefusion"), "inversion") == "false"
    assert get_parameter(config("prompt_optimizer"), "compress") == "false"
    assert get_parameter(config("text_encoder"), "cache_budget_bytes") == "0"
    # facefuse serves the VAEs on OpenVINO; B runs every graph on ONNX Runtime
    vae = parse((source / "vae_decoder" / "config.pbtxt").read_text())
    assert get_parameter(vae, "runtime") == "openvino"
    for model in ("vae_encoder", "vae_decoder", "unet"):
        assert get_parameter(config(model), "runtime", "onnxruntime") == "onnxruntime"
