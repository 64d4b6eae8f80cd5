"""Real batching of requests, the denoising loop and the in-process pipeline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from facefuse.diffusion.loop import LoopRequest, denoise, make_scheduler
from facefuse.runtime.sessions import SessionOptions, open_session, ort_session_options, run_batched


def test_run_batched_groups_by_shape_and_splits_in_order():
    calls = []

    def forward(feeds):
        calls.append(len(feeds["x"]))
        return [feeds["x"] * 2, feeds["x"].sum(axis=1)]

    requests = [
        {"x": np.ones((2, 3), np.float32)},
        {"x": np.full((1, 5), 3, np.float32)},  # another shape: its own forward
        {"x": np.full((1, 3), 4, np.float32)},
    ]
    outputs, stats = run_batched(forward, requests)
    assert sorted(calls) == [1, 3] and stats.forwards == 2 and stats.samples == 4
    assert np.array_equal(outputs[0][0], np.full((2, 3), 2))
    assert np.array_equal(outputs[1][1], [15.0])
    assert np.array_equal(outputs[2][0], np.full((1, 3), 8))


def test_run_batched_respects_max_rows():
    requests = [{"x": np.ones((2, 1), np.float32)} for _ in range(5)]
    _, stats = run_batched(lambda f: [f["x"]], requests, max_rows=4)
    assert stats.forwards == 3 and stats.samples == 10


def test_batched_unet_forward_equals_one_by_one(tiny_repository):
    session = open_session(tiny_repository / "unet" / "1" / "model.onnx")
    rng = np.random.default_rng(0)
    requests = [
        {
            "sample": rng.standard_normal((2, 4, 32, 32)).astype(np.float32),
            "timestep": np.array([900.0, 900.0], np.float32),
            "encoder_hidden_states": rng.standard_normal((2, 77, 64)).astype(np.float32),
        }
        for _ in range(3)
    ]
    outputs, stats = run_batched(lambda f: session.run(None, f), requests)
    assert stats.forwards == 1 and stats.samples == 6
    for request, (batched,) in zip(requests, outputs):
        (alone,) = session.run(None, request)
        assert np.max(np.abs(batched - alone)) < 1e-4


def test_open_session_names_the_missing_or_corrupt_file(tmp_path):
    from facefuse.core.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"model\.onnx"):
        open_session(tmp_path / "model.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"\x00not onnx")
    with pytest.raises(ModelLoadError, match=r"bad\.onnx"):
        open_session(tmp_path / "bad.onnx")


def test_serving_sessions_do_not_spin_unless_asked():
    key = "session.intra_op.allow_spinning"
    assert ort_session_options().get_session_config_entry(key) == "0"
    spinning = ort_session_options(SessionOptions(intra_op_threads=2, allow_spinning=True))
    assert spinning.get_session_config_entry(key) == "1"
    assert spinning.intra_op_num_threads == 2


def _linear_unet(sample, timestep, context):
    return 0.1 * sample + 0.01 * context.mean()


@pytest.mark.parametrize("scheduler", ["dpm++", "ddim", "euler"])
def test_blended_loop_keeps_known_latents_outside_the_mask(tiny_components, scheduler):
    rng = np.random.default_rng(1)
    known = rng.standard_normal((4, 8, 8)).astype(np.float32)
    mask = np.zeros((1, 8, 8), np.float32)
    mask[:, 2:6, 2:6] = 1.0
    request = LoopRequest(
        cond=rng.standard_normal((77, 8)).astype(np.float32),
        uncond=np.zeros((77, 8), np.float32),
        steps=10,
        guidance=5.0,
        seed=3,
        strength=0.6,
        init_latents=known,
        latent_mask=mask,
    )
    result = denoise(
        _linear_unet, make_scheduler(scheduler, tiny_components.scheduler_config), request
    )
    outside = mask[0] == 0
    assert np.allclose(result.latents[:, outside], known[:, outside], atol=1e-6)
    assert not np.allclose(result.latents[:, ~outside], known[:, ~outside])
    assert result.steps_run == 6 and result.unet_calls == 6
    again = denoise(
        _linear_unet, make_scheduler(scheduler, tiny_components.scheduler_config), request
    )
    assert np.array_equal(result.latents, again.latents)


def test_cfg_sends_cond_and_uncond_as_one_batch(tiny_components):
    seen = []

    def unet(sample, timestep, context):
        seen.append((sample.shape[0], timestep.tolist(), context.shape))
        return np.zeros_like(sample)

    request = LoopRequest(
        cond=np.ones((77, 8), np.float32),
        uncond=np.zeros((77, 8), np.float32),
        steps=4,
        guidance=7.5,
        seed=0,
        latent_shape=(4, 8, 8),
    )
    denoise(unet, make_scheduler("ddim", tiny_components.scheduler_config), request)
    assert all(rows == 2 and t[0] == t[1] and ctx == (2, 77, 8) for rows, t, ctx in seen)
    seen.clear()
    request.guidance = 1.0  # no guidance: the unconditional half is skipped
    denoise(unet, make_scheduler("ddim", tiny_components.scheduler_config), request)
    assert all(rows == 1 for rows, _, _ in seen)


def test_in_process_pipeline_fuses_deterministically(tiny_repository, sample_images):
    from facefuse.diffusion.manifest import PipelineManifest
    from facefuse.diffusion.pipeline import Pipeline, params_from
    from facefuse.diffusion.stages import local_stages

    manifest = PipelineManifest.load(tiny_repository / "facefusion" / "1" / "pipeline.json")
    pipeline = Pipeline(local_stages(tiny_repository), manifest)
    source, target = sample_images
    params = params_from(steps=4, strength=0.5, seed=5)
    fused, mask, _box, info = pipeline.fuse(source, target, "make her smile", params)
    assert fused.shape == (256, 256, 3) and mask.shape == (256, 256)
    assert 0.0 <= fused.min() and fused.max() <= 1.0
    assert info["steps_run"] == 2 and json.dumps(info)
    again, *_ = pipeline.fuse(source, target, "make her smile", params)
    assert np.array_equal(fused, again)
    png, png_info = pipeline.fuse_png(source, target, "make her smile", params)
    from facefuse.face.imageio import decode_image

    pasted, target_rgb = decode_image(png, "IMAGE"), decode_image(target, "TARGET_IMAGE")
    assert pasted.shape == target_rgb.shape and not np.array_equal(pasted, target_rgb)
    assert png_info["stage_ms"]["paste_png"] > 0


def test_sample_total_sums_matching_series_only():
    from facefuse.core.metrics import sample_total

    text = (
        "# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="unet",version="1"} 12\n'
        'nv_inference_count{model="vae_decoder",version="1"} 3\n'
        'nv_inference_count_total{model="unet"} 100\n'
        "facefuse_prefix_cache_bytes 5\n"
    )
    assert sample_total(text, "nv_inference_count", model="unet") == 12.0
    assert sample_total(text, "nv_inference_count") == 15.0
    assert sample_total(text, "facefuse_prefix_cache_bytes") == 5.0
    assert sample_total(text, "nv_inference_count", model="text_encoder") == 0.0
