"""TensorRT build code without TensorRT: profiles, the engine checker on fake engines, errors."""

from __future__ import annotations

import importlib.util
import json

import pytest
from facefuse.export import gpu

from facefuse.core.errors import ModelLoadError

BUILT = gpu.EngineTarget("10.3.0", "NVIDIA L4", "8.9")


def _engine(tmp_path, target=BUILT):
    plan = tmp_path / "unet" / "1" / gpu.PLAN_FILE
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_bytes(b"ftrt\x00\x01" + bytes(4096))  # a fake serialized engine
    gpu.write_metadata(plan, target, gpu.unet_profile(16, 64, 768), fp16=True)
    return plan


def test_unet_profile_spans_batch_one_to_n():
    sample, timestep, context = gpu.unet_profile(16, 64, 768)
    assert (sample.min, sample.opt, sample.max) == ((1, 4, 64, 64), (2, 4, 64, 64), (16, 4, 64, 64))
    assert (timestep.min[0], timestep.max[0]) == (1, 16)
    assert context.min == (1, 77, 768) and context.max == (16, 231, 768)
    assert gpu.unet_profile(1, 32, 64)[0].opt == (1, 4, 32, 32)
    assert gpu.vae_decoder_profile(4, 64)[0].max == (4, 4, 64, 64)
    with pytest.raises(ValueError, match="min <= opt <= max"):
        gpu.InputProfile("x", (2, 4), (1, 4), (4, 4))
    with pytest.raises(ValueError, match="batch"):
        gpu.InputProfile("x", (0, 4), (1, 4), (4, 4))


def test_engine_for_this_host_passes(tmp_path):
    meta = gpu.check_engine(_engine(tmp_path), expected=BUILT)
    assert meta["tensorrt_version"] == "10.3.0" and meta["profiles"][0]["max"] == [16, 4, 64, 64]


def test_engine_from_another_tensorrt_or_gpu_is_refused(tmp_path):
    plan = _engine(tmp_path)
    with pytest.raises(ModelLoadError) as exc:
        gpu.check_engine(plan, expected=gpu.EngineTarget("10.5.0", "NVIDIA L4", "8.9"))
    message = str(exc.value)
    assert str(plan) in message and "TensorRT 10.3.0, this host has 10.5.0" in message
    with pytest.raises(ModelLoadError) as exc:
        gpu.check_engine(plan, expected=gpu.EngineTarget("10.3.0", "NVIDIA A100-SXM4-40GB", "8.0"))
    assert "GPU NVIDIA L4 (sm 8.9), this host has NVIDIA A100-SXM4-40GB (sm 8.0)" in str(exc.value)


def test_missing_replaced_or_undocumented_engines_are_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"model\.plan: TensorRT engine not found"):
        gpu.check_engine(tmp_path / "unet" / "1" / gpu.PLAN_FILE, expected=BUILT)
    plan = _engine(tmp_path)
    plan.write_bytes(plan.read_bytes() + b"rebuilt elsewhere")
    with pytest.raises(ModelLoadError, match="does not match its metadata"):
        gpu.check_engine(plan, expected=BUILT)
    meta = gpu.metadata_path(plan)
    meta.write_text("{not json")
    with pytest.raises(ModelLoadError, match="unreadable engine metadata"):
        gpu.check_engine(plan, expected=BUILT)
    meta.write_text(json.dumps({"gpu_name": "x"}))
    with pytest.raises(ModelLoadError, match="unreadable engine metadata"):
        gpu.check_engine(plan, expected=BUILT)
    meta.unlink()
    with pytest.raises(ModelLoadError, match=r"model.plan.json not found"):
        gpu.check_engine(plan, expected=BUILT)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="tensorrt present")
def test_build_without_tensorrt_says_what_is_missing(tmp_path):
    with pytest.raises(gpu.TensorRTMissing, match="tensorrt Python package is not installed"):
        gpu.build_engine(tmp_path / "model.onnx", tmp_path / "model.plan", [])
    with pytest.raises(ModelLoadError, match="tensorrt"):
        gpu.check_engine(_engine(tmp_path))  # expected defaults to this host


def test_gpu_variant_writes_fp16_graphs_without_engines(tiny_repository, tmp_path):
    import shutil

    import numpy as np

    from facefuse.diffusion.manifest import PipelineManifest
    from facefuse.runtime.sessions import open_session

    repo = shutil.copytree(tiny_repository, tmp_path / "repo", symlinks=True)
    manifest = PipelineManifest.load(repo / "facefusion" / "1" / "pipeline.json")
    results = gpu.export_gpu_variant(repo, "fp16", manifest, {"unet": 16}, engines=False)
    assert [(r.model, r.kind) for r in results] == [
        ("unet", "fp16-onnx"),
        ("vae_encoder", "fp16-onnx"),
        ("vae_decoder", "fp16-onnx"),
    ]
    latents = np.random.default_rng(0).standard_normal((1, 4, 32, 32)).astype(np.float32)
    ref, half = (
        open_session(repo / "vae_decoder" / "1" / name).run(None, {"latent": latents})[0]
        for name in ("model.onnx", "model.fp16.onnx")
    )
    assert np.abs(ref - half).max() < 0.05
    with pytest.raises(ValueError, match="fp32 and fp16"):
        gpu.export_gpu_variant(repo, "int8", manifest, {}, engines=False)
