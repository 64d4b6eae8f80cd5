"""Parity: facefuse's denoising loop and served UNet graph against a plain diffusers img2img.

Same model (the tiny components; the fp32 ONNX UNet the ``unet`` Triton model serves on the
facefuse side, PyTorch on the diffusers side), same DDIM scheduler, same text conditioning, same
initial latents and the same seeded noise; no mask, so no blending. The two runs may differ
only by the ONNX export's float error.
"""

from __future__ import annotations

import numpy as np
import torch

from facefuse.diffusion.loop import LoopRequest, denoise, initial_noise, make_scheduler
from facefuse.runtime.sessions import open_session

STEPS, STRENGTH, GUIDANCE, SEED = 10, 0.5, 7.5, 11


def _embeddings(components, text: str) -> np.ndarray:
    ids = components.tokenizer(
        text, padding="max_length", max_length=77, truncation=True, return_tensors="pt"
    ).input_ids
    with torch.no_grad():
        return components.text_encoder(ids)[0][0].numpy()


def test_loop_matches_diffusers_img2img(tiny_components, tiny_repository, monkeypatch):
    from diffusers import StableDiffusionImg2ImgPipeline
    from diffusers.pipelines.stable_diffusion import pipeline_stable_diffusion_img2img as img2img

    c = tiny_components
    channels = c.unet.config.in_channels
    init = np.random.default_rng(5).standard_normal((channels, 16, 16)).astype(np.float32)
    cond, uncond = _embeddings(c, "a portrait photo, smiling"), _embeddings(c, "")

    session = open_session(tiny_repository / "unet" / "1" / "model.onnx")

    def unet(sample, timestep, context):
        feeds = {"sample": sample, "timestep": timestep, "encoder_hidden_states": context}
        return session.run(None, feeds)[0]

    ours = denoise(
        unet,
        make_scheduler("ddim", c.scheduler_config),
        LoopRequest(
            cond=cond,
            uncond=uncond,
            steps=STEPS,
            guidance=GUIDANCE,
            seed=SEED,
            strength=STRENGTH,
            init_latents=init,
        ),
    ).latents

    # diffusers draws its noise with torch; hand it facefuse's seeded noise instead
    noise = torch.from_numpy(initial_noise(SEED, (1, *init.shape)))
    monkeypatch.setattr(img2img, "randn_tensor", lambda shape, **_: noise.reshape(shape))
    pipe = StableDiffusionImg2ImgPipeline(
        vae=c.vae,
        text_encoder=c.text_encoder,
        tokenizer=c.tokenizer,
        unet=c.unet,
        scheduler=make_scheduler("ddim", c.scheduler_config),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        theirs = (
            pipe(
                image=torch.from_numpy(init[None]),  # latents: used as the initial latents as is
                prompt_embeds=torch.from_numpy(cond[None]),
                negative_prompt_embeds=torch.from_numpy(uncond[None]),
                strength=STRENGTH,
                num_inference_steps=STEPS,
                guidance_scale=GUIDANCE,
                output_type="latent",
            )
            .images[0]
            .numpy()
        )

    assert ours.shape == theirs.shape
    scale = float(np.abs(theirs).max())
    assert np.abs(ours - theirs).max() <= 1e-3 * max(scale, 1.0), np.abs(ours - theirs).max()
    assert not np.allclose(ours, init, atol=1e-2)  # the loop did change the latents
