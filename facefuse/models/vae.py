"""The VAE contract: pixels in [-1, 1] <-> scaled latents, for every VAE the project loads.

Two kinds are supported: diffusers ``AutoencoderKL`` (users' SD 1.x folders, the seeded
``tiny``/``mid`` models) and :class:`~facefuse.models.taef2.TinyAutoencoderF2` (the ``faces``
model). :func:`encode_scaled` and :func:`decode_scaled` are the only places that know how each
kind encodes, decodes and scales; the ONNX export and the benchmarks go through them, so the
UNet always sees ``latents * config.scaling_factor`` (and TAEF2's shift, see its module).
"""

from __future__ import annotations

import json
from pathlib import Path

from facefuse.core.errors import ModelLoadError

KL, TAEF2 = "AutoencoderKL", "TinyAutoencoderF2"
KINDS = (KL, TAEF2)


def vae_class_name(folder: str | Path) -> str:
    """The ``_class_name`` of ``folder/config.json``; ModelLoadError when it is not supported."""
    path = Path(folder) / "config.json"
    try:
        name = json.loads(path.read_text()).get("_class_name", "")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: expected a diffusers VAE config.json ({exc})") from exc
    if name not in KINDS:
        raise ModelLoadError(
            f"{path}: VAE class {name!r} is not supported; expected one of {', '.join(KINDS)}"
        )
    return name


def load_vae(folder: str | Path):
    """Load the VAE in ``folder`` (safetensors only), fp32, eval mode."""
    import torch

    name = vae_class_name(folder)
    if name == KL:
        from diffusers import AutoencoderKL as cls
    else:
        from facefuse.models.taef2 import TinyAutoencoderF2 as cls
    return cls.from_pretrained(folder, use_safetensors=True, torch_dtype=torch.float32).eval()


def scale_factor(vae) -> int:
    """Pixels per latent along a side (8 for SD 1.x and TAEF2)."""
    return 2 ** (len(vae.config.block_out_channels) - 1)


def latent_channels(vae) -> int:
    return int(vae.config.latent_channels)


def encode_scaled(vae, image):
    """Pixels [N,3,H,W] in [-1, 1] -> scaled latents (the KL posterior's mean: deterministic)."""
    output = vae.encode(image)
    latents = output.latent_dist.mean if hasattr(output, "latent_dist") else output.latents
    return latents * vae.config.scaling_factor


def decode_scaled(vae, latents):
    """Scaled latents -> pixels in [-1, 1]."""
    return vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]
