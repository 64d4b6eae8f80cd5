"""In-process img2img on the GPU: the facefuse GPU path and the plain-diffusers baseline.

:class:`GpuImg2Img` runs N img2img requests in lock step (the batch that 8 concurrent
requests form at the served ``unet``: 2N UNet rows per call with classifier-free guidance),
every model through a :class:`~facefuse.gpu.runtime.GraphRunner` (FP16, CUDA graphs) and every
tensor on the GPU from the prompt ids to the uint8 image (one host copy at the end).

:func:`diffusers_img2img` builds diffusers' ``StableDiffusionImg2ImgPipeline`` over the same
modules, eager: the baseline that ``facefuse bench gpu`` compares with. Both use DPM-Solver++
(2nd order) from the SD 1.x scheduler config, strength 0.5 of 20 steps = 10 UNet calls.
"""

from __future__ import annotations

import numpy as np

from facefuse.gpu.runtime import DEFAULT_GRAPH_BATCHES, GraphRunner, forward_fn


def dpm_scheduler():
    from facefuse.diffusion.loop import make_scheduler
    from facefuse.models.tiny import SD1_SCHEDULER

    return make_scheduler("dpm++", SD1_SCHEDULER)


def _token_ids(tokenizer, texts: list[str]) -> np.ndarray:
    out = tokenizer(
        texts, padding="max_length", max_length=77, truncation=True, return_tensors="np"
    )
    return np.asarray(out["input_ids"], dtype=np.int64)


class GpuImg2Img:
    """Lock-step img2img over graph runners; ``modules`` are fp32/fp16 torch modules."""

    def __init__(
        self,
        modules: dict,
        tokenizer,
        device,
        dtype,
        graphs: bool = True,
        batches=DEFAULT_GRAPH_BATCHES,
    ):
        self.device, self.dtype, self.tokenizer = device, dtype, tokenizer
        self.modules = modules
        cuda = device.type == "cuda"
        self.runners = {
            kind: GraphRunner(
                forward_fn(kind, modules), batches, enabled=graphs and cuda, name=kind
            )
            for kind in ("text_encoder", "vae_encoder", "unet", "vae_decoder")
        }

    def status(self) -> dict:
        return {kind: runner.status() for kind, runner in self.runners.items()}

    def __call__(
        self,
        images: np.ndarray,
        prompts: list[str],
        steps: int = 20,
        strength: float = 0.5,
        guidance: float = 7.5,
        seed: int = 0,
    ) -> np.ndarray:
        """``images`` uint8 [N,H,W,3] -> uint8 [N,H,W,3]."""
        import torch

        n = len(prompts)
        run = self.runners
        with torch.inference_mode():
            ids = torch.from_numpy(_token_ids(self.tokenizer, [*prompts, *[""] * n]))
            hidden = run["text_encoder"](ids.to(self.device))[0]  # [2N, 77, D]: cond, uncond
            pixels = torch.from_numpy(np.ascontiguousarray(images)).to(self.device)
            pixels = pixels.permute(0, 3, 1, 2).to(self.dtype) / 127.5 - 1.0
            init = run["vae_encoder"](pixels)[0].float()
            scheduler = dpm_scheduler()
            scheduler.set_timesteps(steps, device=self.device)
            kept = min(int(steps * strength), steps)
            start = max(steps - kept, 0) * scheduler.order
            timesteps = scheduler.timesteps[start:]
            if hasattr(scheduler, "set_begin_index"):
                scheduler.set_begin_index(start)
            generator = torch.Generator(self.device).manual_seed(seed)
            noise = torch.randn(init.shape, generator=generator, device=self.device)
            latents = scheduler.add_noise(init, noise, timesteps[:1].repeat(n))
            for t in timesteps:
                model_in = scheduler.scale_model_input(torch.cat([latents, latents]), t)
                times = t.to(torch.float32).expand(2 * n).contiguous()
                pred = run["unet"](model_in.to(self.dtype), times, hidden)[0].float()
                cond, uncond = pred[:n], pred[n:]
                noise_pred = uncond + guidance * (cond - uncond)
                latents = scheduler.step(noise_pred, t, latents).prev_sample
            image = run["vae_decoder"](latents.to(self.dtype))[0]
            if not bool(torch.isfinite(image).all()):  # the served pipeline refuses these too
                raise FloatingPointError("facefuse GPU img2img produced NaN or inf pixels")
            image = ((image.float() / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)
            return image.permute(0, 2, 3, 1).cpu().numpy()


def diffusers_img2img(modules: dict, tokenizer):
    """diffusers' ``StableDiffusionImg2ImgPipeline`` over ``modules`` (unet, vae, text_encoder)."""
    from diffusers import StableDiffusionImg2ImgPipeline

    pipe = StableDiffusionImg2ImgPipeline(
        vae=modules["vae"],
        text_encoder=modules["text_encoder"],
        tokenizer=tokenizer,
        unet=modules["unet"],
        scheduler=dpm_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_diffusers(pipe, images: np.ndarray, prompts: list[str], steps, strength, guidance, seed):
    """One baseline call for N requests (PIL in, numpy out, as a diffusers user does)."""
    import torch
    from PIL import Image

    generator = torch.Generator(pipe.device).manual_seed(seed)
    pil = [Image.fromarray(image) for image in images]
    out = pipe(
        prompt=prompts,
        image=pil,
        strength=strength,
        num_inference_steps=steps,
        guidance_scale=guidance,
        generator=generator,
        output_type="np",
    )
    images = np.asarray(out.images)
    if not np.isfinite(images).all():  # a NaN would be cast to 0 silently below
        raise FloatingPointError("diffusers img2img produced NaN or inf pixels")
    return (images * 255).round().astype(np.uint8)
