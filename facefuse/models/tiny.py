"""A seeded tiny model with the real Stable Diffusion 1.x architecture.

Same seed, same weights on every machine: weights come from ``torch.manual_seed`` before each
component is constructed, on CPU, in fp32. The folder written by :func:`save_tiny_model` is a
normal diffusers folder (``model_index.json``, ``unet/``, ``vae/``, ``text_encoder/``,
``tokenizer/``, ``scheduler/``), so everything downstream loads it exactly like a real
SD 1.5 checkpoint. ``sd15_shapes`` builds the real SD 1.5 sizes with random weights, for
honest speed measurements.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from facefuse.prompt.tokenizer import BOS_ID, EOS_ID, MAX_LENGTH, VOCAB_SIZE, build_clip_tokenizer

DEFAULT_SEED = 0

# SD 1.x scheduler settings (as in runwayml/stable-diffusion-v1-5 scheduler_config.json).
SD1_SCHEDULER = {
    "_class_name": "DDIMScheduler",
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
    "clip_sample": False,
    "set_alpha_to_one": False,
    "steps_offset": 1,
    "prediction_type": "epsilon",
}


@dataclass(frozen=True)
class ModelShape:
    """Sizes of one SD 1.x-architecture model. ``sample_size`` is the UNet latent side."""

    text_hidden: int
    text_layers: int
    text_heads: int
    text_ffn: int
    unet_channels: tuple[int, ...]
    unet_layers_per_block: int
    unet_head_dim: int | tuple[int, ...]
    vae_channels: tuple[int, ...]
    vae_layers_per_block: int
    sample_size: int
    norm_groups: int = 32
    latent_channels: int = 4  # the VAE's (32 for TAEF2, the ``faces`` model)


TINY = ModelShape(
    text_hidden=64,
    text_layers=4,
    text_heads=4,
    text_ffn=256,
    unet_channels=(32, 64, 64),
    unet_layers_per_block=1,
    unet_head_dim=8,
    vae_channels=(32, 32, 64, 64),
    vae_layers_per_block=1,
    sample_size=32,
)

# A mid-size model whose UNet dominates the cost (about 90% of a request), for throughput and
# server-overhead measurements where the tiny model's per-call overheads would dominate.
MID = ModelShape(
    text_hidden=256,
    text_layers=6,
    text_heads=4,
    text_ffn=1024,
    unet_channels=(128, 256, 256),
    unet_layers_per_block=2,
    unet_head_dim=8,
    vae_channels=(32, 32, 64, 64),
    vae_layers_per_block=1,
    sample_size=32,
)

SD15 = ModelShape(
    text_hidden=768,
    text_layers=12,
    text_heads=12,
    text_ffn=3072,
    unet_channels=(320, 640, 1280, 1280),
    unet_layers_per_block=2,
    unet_head_dim=8,
    vae_channels=(128, 256, 512, 512),
    vae_layers_per_block=2,
    sample_size=64,
)


def build_text_encoder(shape: ModelShape, seed: int = DEFAULT_SEED):
    """transformers ``CLIPTextModel`` (CLIP ViT-L/14 text tower for ``SD15``)."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=shape.text_hidden,
        intermediate_size=shape.text_ffn,
        num_hidden_layers=shape.text_layers,
        num_attention_heads=shape.text_heads,
        max_position_embeddings=MAX_LENGTH,
        hidden_act="quick_gelu",
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=1,
        projection_dim=shape.text_hidden,
    )
    torch.manual_seed(seed)
    return CLIPTextModel(config).eval()


def build_unet(shape: ModelShape, seed: int = DEFAULT_SEED):
    """diffusers ``UNet2DConditionModel`` with SD 1.x block layout and cross-attention."""
    import torch
    from diffusers import UNet2DConditionModel

    levels = len(shape.unet_channels)
    down = ("CrossAttnDownBlock2D",) * (levels - 1) + ("DownBlock2D",)
    up = ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (levels - 1)
    torch.manual_seed(seed + 1)
    return UNet2DConditionModel(
        sample_size=shape.sample_size,
        in_channels=shape.latent_channels,
        out_channels=shape.latent_channels,
        block_out_channels=shape.unet_channels,
        layers_per_block=shape.unet_layers_per_block,
        down_block_types=down,
        up_block_types=up,
        cross_attention_dim=shape.text_hidden,
        attention_head_dim=shape.unet_head_dim,
        norm_num_groups=shape.norm_groups,
    ).eval()


def build_vae(shape: ModelShape, seed: int = DEFAULT_SEED):
    """diffusers ``AutoencoderKL`` with SD 1.x layout (4 levels: 8x spatial factor)."""
    import torch
    from diffusers import AutoencoderKL

    levels = len(shape.vae_channels)
    torch.manual_seed(seed + 2)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * levels,
        up_block_types=("UpDecoderBlock2D",) * levels,
        block_out_channels=shape.vae_channels,
        layers_per_block=shape.vae_layers_per_block,
        latent_channels=4,
        norm_num_groups=shape.norm_groups,
        sample_size=shape.sample_size * 2 ** (levels - 1),
        scaling_factor=0.18215,
    ).eval()


NAMED_SHAPES = {"tiny": TINY, "mid": MID}


def shape_name(shape: ModelShape) -> str:
    return next((name for name, s in NAMED_SHAPES.items() if s == shape), "custom")


def save_model(out_dir: str | Path, shape: ModelShape = TINY, seed: int = DEFAULT_SEED) -> Path:
    """Write a diffusers folder with seeded weights of ``shape``; returns the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_text_encoder(shape, seed).save_pretrained(out / "text_encoder")
    build_unet(shape, seed).save_pretrained(out / "unet")
    build_vae(shape, seed).save_pretrained(out / "vae")
    build_clip_tokenizer().save_pretrained(out / "tokenizer")
    (out / "scheduler").mkdir(exist_ok=True)
    (out / "scheduler" / "scheduler_config.json").write_text(json.dumps(SD1_SCHEDULER, indent=2))
    index = {
        "_class_name": "StableDiffusionPipeline",
        "_diffusers_version": "0.42.1",
        "text_encoder": ["transformers", "CLIPTextModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["diffusers", "AutoencoderKL"],
        "scheduler": ["diffusers", "DDIMScheduler"],
        "_facefuse": {"seed": seed, "shape": shape_name(shape)},
    }
    (out / "model_index.json").write_text(json.dumps(index, indent=2))
    return out
