"""The denoising loop: diffusers schedulers, classifier-free guidance, blended latent diffusion.

The UNet is any callable ``unet(sample[B,4,h,w], timestep[B], context[B,S,D]) -> noise[B,4,h,w]``
on numpy arrays (an ONNX session in-process, or a BLS call to the ``unet`` Triton model), so
the same loop serves the Triton pipelines, the in-process benchmark and the tests.

Invariants: the same inputs and seed give the same latents; with a latent mask, latents
outside the mask equal the (noised, then clean at the last step) known latents after every
step, exactly as diffusers' inpainting pipeline does for 4-channel UNets. With ``invert``
(DiffEdit) "noised" means the known latents' own DDIM-inverted path at that step's noise
level, the seed is not used, and the run starts from the end of that path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from facefuse.core.errors import FacefuseError

SCHEDULERS = ("dpm++", "unipc", "ddim", "euler")
DEFAULT_SCHEDULER = "dpm++"

UnetFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class DeepCacheUnets:
    """DeepCache's pair (:mod:`facefuse.models.deepcache`) on numpy arrays.

    ``deep(sample, timestep, context) -> (noise, deep)``: the whole UNet, also returning the
    deep features; ``shallow(sample, timestep, context, deep) -> noise``: the shallowest layers
    on deep features from an earlier step."""

    deep: Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
    shallow: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class DenoiseCancelled(FacefuseError):
    """``LoopRequest.should_stop`` said stop (the client cancelled): the loop ran no more steps."""

    def __init__(self, steps_run: int, steps_total: int):
        self.steps_run = steps_run
        super().__init__(f"request cancelled after {steps_run} of {steps_total} denoising steps")


def make_scheduler(name: str, config: dict):
    """A diffusers scheduler built from an SD ``scheduler_config.json`` dict."""
    from diffusers import (
        DDIMScheduler,
        DPMSolverMultistepScheduler,
        EulerDiscreteScheduler,
        UniPCMultistepScheduler,
    )

    classes = {
        "dpm++": DPMSolverMultistepScheduler,
        "unipc": UniPCMultistepScheduler,
        "ddim": DDIMScheduler,
        "euler": EulerDiscreteScheduler,
    }
    if name not in classes:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {name!r}")
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    if name == "dpm++":
        return classes[name].from_config(config, algorithm_type="dpmsolver++", solver_order=2)
    return classes[name].from_config(config)


@dataclass
class LoopRequest:
    """What one denoising run needs. Context arrays are [S, D]; latents [4, h, w]."""

    cond: np.ndarray
    uncond: np.ndarray
    steps: int
    guidance: float
    seed: int
    strength: float = 1.0
    init_latents: np.ndarray | None = None  # None: txt2img from pure noise
    latent_mask: np.ndarray | None = None  # [1, h, w] in [0, 1]; 1 = regenerate
    # [1, h, w] in [0, 1]: each latent's share of ``strength`` (differential-diffusion style:
    # a latent with share s is held to the noised input until the last s of the run); None: 1
    strength_map: np.ndarray | None = None
    latent_shape: tuple[int, int, int] = (4, 64, 64)
    cfg_truncation: float = 0.0  # skip the unconditional half for this last fraction of steps
    # DeepCache: the whole UNet every N steps, its shallow layers on cached deep features
    # between (N = 1: the plain UNet at every step; N > 1 needs ``denoise(deep_cache=...)``)
    deep_cache_interval: int = 1
    # DDIM inversion (DiffEdit): img2img starts from the init latents inverted to the first
    # step's noise level with the unconditional context, not from seeded noise, and the held
    # latents follow that inverted path; needs a DDIMScheduler. Costs one UNet row per kept step.
    invert: bool = False
    # checked before every step; True stops the loop with DenoiseCancelled (in Triton:
    # ``request.is_cancelled``), so a cancelled request frees its slot at the next step
    should_stop: Callable[[], bool] | None = None


@dataclass
class LoopResult:
    latents: np.ndarray  # [4, h, w]
    steps_run: int
    unet_calls: int
    unet_rows: int
    shallow_calls: int = 0  # of unet_calls, those that ran DeepCache's shallow graph


def initial_noise(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Seeded standard-normal noise, identical on every machine (numpy PCG64)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def denoise(
    unet: UnetFn, scheduler, request: LoopRequest, deep_cache: DeepCacheUnets | None = None
) -> LoopResult:
    """Run the loop; img2img when ``init_latents`` is given, blending outside the mask.

    With ``request.deep_cache_interval`` N > 1, step i runs ``deep_cache.deep`` when i % N == 0
    and ``deep_cache.shallow`` on the deep features it returned otherwise (the conditional row's
    features when CFG truncation drops the unconditional half); ``unet`` is not called."""
    import torch

    r = request
    if r.deep_cache_interval < 1:
        raise ValueError(f"deep_cache_interval must be >= 1, got {r.deep_cache_interval}")
    if r.deep_cache_interval > 1 and deep_cache is None:
        raise ValueError("deep_cache_interval > 1 needs the DeepCache pair (unet_deep/shallow)")
    if r.invert:
        from diffusers import DDIMScheduler

        if r.init_latents is None:
            raise ValueError("invert needs init_latents (img2img)")
        if not isinstance(scheduler, DDIMScheduler):
            raise ValueError(f"invert needs the ddim scheduler, got {type(scheduler).__name__}")
    shape = r.init_latents.shape if r.init_latents is not None else r.latent_shape
    noise = torch.from_numpy(initial_noise(r.seed, (1, *shape)))
    scheduler.set_timesteps(r.steps)
    timesteps = scheduler.timesteps
    if r.init_latents is None:
        latents = noise * scheduler.init_noise_sigma
        known = None
    else:
        kept = min(r.steps, max(1, round(r.steps * r.strength)))
        start = (r.steps - kept) * scheduler.order
        timesteps = timesteps[start:]
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(start)
        known = torch.from_numpy(r.init_latents[None].astype(np.float32))
        latents = scheduler.add_noise(known, noise, timesteps[:1])
    mask = (
        None if r.latent_mask is None else torch.from_numpy(r.latent_mask[None].astype(np.float32))
    )
    share = None
    if r.strength_map is not None and mask is not None:
        share = torch.from_numpy(r.strength_map[None].astype(np.float32))
    context_both = np.stack([r.cond, r.uncond]).astype(np.float32)
    context_cond = context_both[:1]
    guided_steps = len(timesteps) - int(len(timesteps) * r.cfg_truncation)
    calls = rows = shallow_calls = 0
    path = None  # the inverted latents, path[k] at the noise level of timesteps[-1 - k]
    if r.invert:
        full = unet if r.deep_cache_interval == 1 else (lambda *a: deep_cache.deep(*a)[0])
        path = invert(full, scheduler, known, len(timesteps), context_both[1:], r.should_stop)
        latents = path[-1]
        calls = rows = len(path)
    cached = None  # DeepCache's deep features of the last full step, [rows, C, h, w]

    def predict(i: int, sample: np.ndarray, times: np.ndarray, context: np.ndarray):
        nonlocal cached, shallow_calls
        if r.deep_cache_interval == 1:
            return unet(sample, times, context)
        if i % r.deep_cache_interval == 0 or cached is None or len(cached) < len(sample):
            pred, cached = deep_cache.deep(sample, times, context)
            return pred
        shallow_calls += 1
        return deep_cache.shallow(sample, times, context, cached[: len(sample)])

    for i, t in enumerate(timesteps):
        if r.should_stop is not None and r.should_stop():
            raise DenoiseCancelled(i, len(timesteps))
        model_input = scheduler.scale_model_input(latents, t).numpy()
        use_cfg = r.guidance > 1.0 and i < guided_steps
        if use_cfg:
            sample = np.concatenate([model_input, model_input])
            times = np.full((2,), float(t), dtype=np.float32)
            pred = predict(i, sample, times, context_both)
            noise_pred = pred[1] + r.guidance * (pred[0] - pred[1])
        else:
            times = np.full((1,), float(t), dtype=np.float32)
            pred = predict(i, model_input, times, context_cond)
            noise_pred = pred[0]
        calls += 1
        rows += len(pred)
        latents = scheduler.step(torch.from_numpy(noise_pred[None]), t, latents).prev_sample
        if known is not None and mask is not None:
            if i < len(timesteps) - 1:
                proper = (
                    path[len(timesteps) - 2 - i]
                    if path is not None
                    else scheduler.add_noise(known, noise, timesteps[i + 1 : i + 2])
                )
            else:
                proper = known
            step_mask = mask
            if share is not None:  # released once the run's remaining fraction <= its share
                remaining = 1.0 - (i + 1) / len(timesteps)
                step_mask = mask * (share > remaining).to(mask.dtype)
            latents = (1 - step_mask) * proper + step_mask * latents
    out = latents[0].numpy().astype(np.float32)
    return LoopResult(out, len(timesteps), calls, rows, shallow_calls)


def invert(unet: UnetFn, scheduler, known, kept: int, context: np.ndarray, should_stop=None):
    """DDIM inversion of the clean latents ``known`` [1, C, h, w] over the last ``kept`` of the
    forward ``scheduler``'s timesteps (diffusers' ``DDIMInverseScheduler`` on the same config):
    returns ``kept`` latents, the k-th at the noise level of the k-th smallest forward timestep,
    so the last one is where the forward run starts. ``context`` [1, S, D]."""
    import torch
    from diffusers import DDIMInverseScheduler

    inverse = DDIMInverseScheduler.from_config(scheduler.config)
    inverse.set_timesteps(scheduler.num_inference_steps)
    latents, path = known, []
    for t in inverse.timesteps[:kept]:
        if should_stop is not None and should_stop():
            raise DenoiseCancelled(0, kept)
        times = np.full((1,), float(t), dtype=np.float32)
        pred = unet(inverse.scale_model_input(latents, t).numpy(), times, context)
        latents = inverse.step(torch.from_numpy(pred[:1]), t, latents).prev_sample
        path.append(latents)
    return path
