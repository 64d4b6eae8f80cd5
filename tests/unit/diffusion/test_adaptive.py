"""Adaptive steps from face complexity, CFG truncation, and their wiring into the Pipeline."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.diffusion.adaptive import MAX_STEPS, MIN_STEPS, measure, steps_for


def _textured(side: int, amount: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = np.full((side, side, 3), 0.5)
    return np.clip(base + amount * rng.standard_normal((side, side, 1)), 0, 1)


def test_flat_gives_min_and_noise_gives_max_steps():
    assert measure(np.full((128, 128, 3), 0.4)).steps == MIN_STEPS
    assert measure(_textured(128, 0.4)).steps == MAX_STEPS
    assert steps_for(-1) == MIN_STEPS and steps_for(2) == MAX_STEPS and steps_for(0.5) == 22


def test_more_detail_never_gives_fewer_steps():
    yy, xx = np.mgrid[0:128, 0:128] / 128.0
    steps = []
    for frequency in (1, 4, 8, 16, 32):
        stripes = 0.5 + 0.4 * np.sin(2 * np.pi * frequency * (xx + 0.3 * yy))
        steps.append(measure(np.repeat(stripes[..., None], 3, axis=2)).steps)
    assert steps == sorted(steps) and steps[0] < steps[-1]


def test_only_the_masked_region_counts():
    image = _textured(128, 0.4)
    image[32:96, 32:96] = 0.6  # a flat face region inside a busy background
    mask = np.zeros((128, 128))
    mask[40:88, 40:88] = 1.0
    assert measure(image, mask).steps == MIN_STEPS
    assert measure(image).steps > MIN_STEPS
    assert measure(image, np.zeros((128, 128))).steps == MIN_STEPS
    with pytest.raises(ValueError, match="mask shape"):
        measure(image, mask[:64])


def test_resolution_does_not_change_the_choice(sample_images):
    from facefuse.face.fusion import prepare_fusion
    from facefuse.face.imageio import decode_image

    source, target = (decode_image(b, f) for b, f in zip(sample_images, ("S", "T")))
    small = measure(*prepare_fusion(source, target, 256).to_arrays()[:2])
    large = measure(*prepare_fusion(source, target, 512).to_arrays()[:2])
    assert MIN_STEPS <= small.steps <= MAX_STEPS and abs(small.steps - large.steps) <= 1
    assert set(small.info()) == {"edge_density", "high_freq_energy", "complexity", "steps"}


def _fake_stages(composite: np.ndarray, calls: list):
    """Numpy stand-ins with the real shapes; the UNet records its batch sizes."""
    from facefuse.diffusion.pipeline import Stages

    size = composite.shape[0]
    mask = np.ones((size, size), dtype=np.float32)

    def unet(sample, timestep, context):
        calls.append(len(sample))
        return np.zeros_like(sample)

    return Stages(
        analyze_faces=lambda a, b, s: (composite.astype(np.float32), mask, np.array([0, 0, s, s])),
        optimize_prompt=lambda text: (np.zeros((1, 77), np.int64), np.zeros((1, 77), np.int64), {}),
        encode_text=lambda ids: (np.zeros((len(ids), 77, 8), np.float32), np.zeros(len(ids))),
        encode_image=lambda image: np.zeros((1, 4, size // 8, size // 8), np.float32),
        unet=unet,
        decode_latents=lambda latents: np.zeros((1, 3, size, size), np.float32),
    )


def _pipeline(composite, calls, **options):
    from facefuse.diffusion.manifest import PipelineManifest
    from facefuse.diffusion.pipeline import Pipeline
    from facefuse.models.tiny import SD1_SCHEDULER

    manifest = PipelineManifest("test", composite.shape[0], 8, 8, 0, SD1_SCHEDULER)
    return Pipeline(_fake_stages(composite, calls), manifest, **options)


def test_pipeline_uses_adaptive_steps_only_when_asked():
    from facefuse.diffusion.pipeline import params_from

    busy = _textured(64, 0.4)
    calls: list = []
    pipeline = _pipeline(busy, calls, adaptive_steps=True)
    params = params_from(strength=1.0)
    *_, info = pipeline.fuse(b"a", b"b", "x", params, auto_steps=True)
    assert info["steps"] == MAX_STEPS == info["adaptive"]["steps"]
    assert info["steps_policy"] == "adaptive" and len(calls) == MAX_STEPS
    *_, info = pipeline.fuse(b"a", b"b", "x", params, auto_steps=False)  # STEPS was given
    assert info["steps"] == 20 and info["steps_policy"] == "fixed" and "adaptive" not in info
    fixed = _pipeline(busy, [], adaptive_steps=False)
    *_, info = fixed.fuse(b"a", b"b", "x", params, auto_steps=True)
    assert info["steps"] == 20 and info["variant"] == "fp32"


def test_cfg_truncation_drops_the_unconditional_half_at_the_end():
    from facefuse.diffusion.pipeline import params_from

    calls: list = []
    pipeline = _pipeline(np.full((64, 64, 3), 0.5), calls, cfg_truncation=0.25)
    *_, info = pipeline.fuse(b"a", b"b", "x", params_from(steps=20, strength=1.0))
    assert calls == [2] * 15 + [1] * 5 and info["cfg_truncation"] == 0.25
    with pytest.raises(ValueError, match="cfg_truncation"):
        _pipeline(np.zeros((64, 64, 3)), [], cfg_truncation=1.5)


def test_default_steps_is_parsed_kept_and_checked():
    """The served ``default_steps`` parameter: what a request without STEPS runs; a value
    outside the request limits fails the load with a line naming the parameter."""
    from facefuse.diffusion.pipeline import DEFAULT_STEPS, Pipeline, options_from_parameters

    assert options_from_parameters({})["default_steps"] == DEFAULT_STEPS
    options = options_from_parameters({"default_steps": "10"})
    assert _pipeline(_textured(64, 0.4), [], **options).default_steps == 10
    for bad in ("0", "101", "ten"):
        with pytest.raises(ValueError, match="pipeline parameter default_steps"):
            options_from_parameters({"default_steps": bad})
    with pytest.raises(ValueError, match=r"default_steps must be in 1\.\.100"):
        Pipeline(None, None, default_steps=0)


def test_default_strength_is_parsed_kept_and_checked():
    """The served ``default_strength``: what a request without STRENGTH runs; outside the
    request limits it fails the load with a line naming the parameter."""
    from facefuse.diffusion.pipeline import DEFAULT_STRENGTH, Pipeline, options_from_parameters

    assert options_from_parameters({})["default_strength"] == DEFAULT_STRENGTH
    options = options_from_parameters({"default_strength": "0.7"})
    assert _pipeline(_textured(64, 0.4), [], **options).default_strength == 0.7
    for bad in ("0.01", "1.5", "most"):
        with pytest.raises(ValueError, match="pipeline parameter default_strength"):
            options_from_parameters({"default_strength": bad})
    with pytest.raises(ValueError, match=r"default_strength must be in \[0.05, 1.0\]"):
        Pipeline(None, None, default_strength=0.0)


def test_autoencoder_residual_returns_the_composite_where_nothing_was_regenerated():
    """With the stand-in decoder (every latent decodes to mid-grey) the round trip loses the
    whole composite; the residual gives it back inside the mask, with one more decoder call."""
    from facefuse.diffusion.pipeline import params_from

    composite = _textured(64, 0.4)
    calls: list = []
    plain = _pipeline(composite, calls)
    fused, _, _, info = plain.fuse(b"a", b"b", "x", params_from(steps=4))
    assert np.allclose(fused, 0.5) and not info["autoencoder_residual"]
    with_residual = _pipeline(composite, calls, autoencoder_residual=True)
    fused, _, _, info = with_residual.fuse(b"a", b"b", "x", params_from(steps=4))
    np.testing.assert_allclose(fused, np.clip(composite, 0, 1), atol=1e-6)  # mask is all ones
    assert info["autoencoder_residual"] and "vae_decoder_init" in info["stage_ms"]
