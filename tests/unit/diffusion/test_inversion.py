"""DDIM inversion (DiffEdit): img2img from the init latents' own noise instead of seeded noise."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.diffusion.loop import LoopRequest, denoise, invert, make_scheduler
from facefuse.models.tiny import SD1_SCHEDULER

KNOWN = np.random.default_rng(0).standard_normal((4, 8, 8)).astype(np.float32)


def _unet(calls: list):
    """A smooth stand-in UNet (epsilon = a fixed linear map of the sample), logging its rows."""
    weight = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32) * 0.1

    def unet(sample, times, context):
        calls.append(len(sample))
        return np.einsum("oc,bchw->bohw", weight, sample) + 0.3 * sample

    return unet


def _request(**overrides) -> LoopRequest:
    fields = dict(
        cond=np.ones((77, 8), np.float32),
        uncond=np.zeros((77, 8), np.float32),
        steps=10,
        guidance=1.0,
        seed=0,
        strength=0.5,
        init_latents=KNOWN,
        latent_mask=np.ones((1, 8, 8), np.float32),
        invert=True,
    )
    return LoopRequest(**(fields | overrides))


def test_inversion_then_denoising_comes_back_to_the_input_and_ignores_the_seed():
    """Without guidance, DDIM inverted then DDIM denoised with the same UNet returns (close
    to) the init latents, much closer than img2img from seeded noise; the seed plays no part."""
    calls: list = []
    back = denoise(_unet(calls), make_scheduler("ddim", SD1_SCHEDULER), _request())
    other_seed = denoise(_unet([]), make_scheduler("ddim", SD1_SCHEDULER), _request(seed=9))
    noised = denoise(_unet([]), make_scheduler("ddim", SD1_SCHEDULER), _request(invert=False))
    assert np.array_equal(back.latents, other_seed.latents)
    error = np.abs(back.latents - KNOWN).mean()
    assert error < 0.1 * np.abs(noised.latents - KNOWN).mean(), error
    # 5 inversion calls of one row, then 5 denoising calls of one row (guidance 1)
    assert calls == [1] * 10 and (back.unet_calls, back.steps_run) == (10, 5)


def test_inversion_uses_the_unconditional_row_and_guidance_doubles_only_the_forward_rows():
    contexts: list = []

    def unet(sample, times, context):
        contexts.append(context[:, 0, 0].tolist())
        return 0.1 * sample

    result = denoise(unet, make_scheduler("ddim", SD1_SCHEDULER), _request(guidance=5.0))
    assert contexts == [[0.0]] * 5 + [[1.0, 0.0]] * 5
    assert (result.unet_calls, result.unet_rows) == (10, 15)


def test_the_inverted_path_climbs_to_the_first_denoising_step():
    scheduler = make_scheduler("ddim", SD1_SCHEDULER)
    scheduler.set_timesteps(10)
    known = np.asarray(KNOWN[None])
    import torch

    path = invert(lambda s, t, c: 0.0 * s, scheduler, torch.from_numpy(known), 3, KNOWN[:1, :1])
    assert len(path) == 3 and all(p.shape == known.shape for p in path)
    # with a UNet that predicts zero noise the DDIM inverse step only rescales by alphas
    alphas = scheduler.alphas_cumprod
    levels = [int(t) for t in scheduler.timesteps[-3:]][::-1]  # 1, 101, 201
    expected = known * float(np.sqrt(alphas[levels[-1]] / alphas[0]))
    assert np.allclose(path[-1].numpy(), expected, rtol=1e-4)


@pytest.mark.parametrize(
    ("scheduler", "overrides", "message"),
    [
        ("dpm++", {}, "invert needs the ddim scheduler"),
        ("ddim", {"init_latents": None}, "invert needs init_latents"),
    ],
)
def test_inversion_refuses_what_it_cannot_invert(scheduler, overrides, message):
    with pytest.raises(ValueError, match=message):
        denoise(_unet([]), make_scheduler(scheduler, SD1_SCHEDULER), _request(**overrides))


def test_the_pipeline_option_is_parsed_and_needs_ddim():
    from facefuse.diffusion.pipeline import Pipeline, options_from_parameters

    assert options_from_parameters({})["inversion"] is False
    assert options_from_parameters({"inversion": "true"})["inversion"] is True
    with pytest.raises(ValueError, match="pipeline parameter inversion must be true or false"):
        options_from_parameters({"inversion": "yes"})
    with pytest.raises(ValueError, match="inversion needs the ddim scheduler, got 'dpm\\+\\+'"):
        Pipeline(None, None, scheduler="dpm++", inversion=True)
