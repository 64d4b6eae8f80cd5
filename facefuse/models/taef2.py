"""TAEF2, the tiny autoencoder of the FLUX.2 latent space, as a diffusers model.

Written by hand from the tensor shapes of the published weights (MIT, Ollin Boer Bohan,
github madebyollin/taesd): diffusers' ``AutoencoderTiny`` cannot hold it, because its encoder's
last three blocks (and the decoder's first three) carry an extra 1x1-conv / GroupNorm branch.

It follows diffusers' ``AutoencoderTiny`` conventions, so SD 1.x pipelines (and
:mod:`facefuse.models.vae`) use it like any diffusers VAE: ``encode(x).latents`` takes RGB in
[-1, 1] and returns latents with 32 channels at 1/8 of the side, ``decode(z).sample`` returns RGB
in [-1, 1], and callers multiply by ``config.scaling_factor`` after encoding and divide before
decoding. Invariant: ``encode`` returns ``raw - shift_factor``, ``decode`` adds it back, so
``(raw - shift_factor) * scaling_factor`` (zero mean, unit variance on the training crops) is what
the UNet sees, also inside a stock diffusers img2img pipeline that knows no shift.
``raw_encode`` / ``raw_decode`` work on raw latents and pixels in [0, 1] (training).
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.autoencoders.autoencoder_tiny import AutoencoderTinyOutput
from diffusers.models.autoencoders.vae import DecoderOutput
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

CLASS_NAME = "TinyAutoencoderF2"
LATENT_CHANNELS = 32
SCALE_FACTOR = 8


def _conv(n_in: int, n_out: int, **kwargs) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, **kwargs)


class _Clamp(nn.Module):
    def forward(self, x):
        return torch.tanh(x / 3) * 3


class _Block(nn.Module):
    """Residual block; ``norm_branch`` adds TAEF2's 1x1 / GroupNorm branch before it."""

    def __init__(self, channels: int = 64, norm_branch: bool = False):
        super().__init__()
        self.conv = nn.Sequential(
            _conv(channels, channels),
            nn.ReLU(),
            _conv(channels, channels),
            nn.ReLU(),
            _conv(channels, channels),
        )
        self.pool = None
        if norm_branch:
            wide = channels * 4
            self.pool = nn.Sequential(
                nn.Conv2d(channels, wide, 1, bias=False),
                nn.GroupNorm(4, wide),
                nn.ReLU(),
                nn.Conv2d(wide, channels, 1, bias=False),
            )
        self.fuse = nn.ReLU()

    def forward(self, x):
        if self.pool is not None:
            x = x + self.pool(x)
        return self.fuse(self.conv(x) + x)


def _encoder(latent_channels: int) -> nn.Sequential:
    def down():
        return _conv(64, 64, stride=2, bias=False)

    def blocks(norm=False):
        return [_Block(64, norm) for _ in range(3)]

    return nn.Sequential(
        _conv(3, 64),
        _Block(64),
        down(),
        *blocks(),
        down(),
        *blocks(),
        down(),
        *blocks(norm=True),
        _conv(64, latent_channels),
    )


def _decoder(latent_channels: int) -> nn.Sequential:
    def up():
        return [nn.Upsample(scale_factor=2), _conv(64, 64, bias=False)]

    def blocks(norm=False):
        return [_Block(64, norm) for _ in range(3)]

    return nn.Sequential(
        _Clamp(),
        _conv(latent_channels, 64),
        nn.ReLU(),
        *blocks(norm=True),
        *up(),
        *blocks(),
        *up(),
        *blocks(),
        *up(),
        _Block(64),
        _conv(64, 3),
    )


class TinyAutoencoderF2(ModelMixin, ConfigMixin):
    """TAEF2 with diffusers' VAE interface (see the module docstring).

    ``block_out_channels`` is there for ``2 ** (len(block_out_channels) - 1)``, the spatial
    factor (8) that diffusers pipelines read from every VAE config.
    """

    @register_to_config
    def __init__(
        self,
        latent_channels: int = LATENT_CHANNELS,
        scaling_factor: float = 1.0,
        shift_factor: float = 0.0,
        block_out_channels: tuple[int, ...] = (64, 64, 64, 64),
    ):
        super().__init__()
        self.encoder = _encoder(latent_channels)
        self.decoder = _decoder(latent_channels)

    def raw_encode(self, pixels01: torch.Tensor) -> torch.Tensor:
        """RGB [N,3,H,W] in [0, 1] -> raw latents [N,32,H/8,W/8]."""
        return self.encoder(pixels01)

    def raw_decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Raw latents -> RGB in [0, 1]."""
        return self.decoder(latents).clamp(0.0, 1.0)

    def encode(self, x: torch.Tensor, return_dict: bool = True):
        latents = self.raw_encode(x.add(1).div(2)) - self.config.shift_factor
        return AutoencoderTinyOutput(latents=latents) if return_dict else (latents,)

    def decode(self, z: torch.Tensor, return_dict: bool = True, generator=None):
        sample = self.raw_decode(z + self.config.shift_factor).mul(2).sub(1)
        return DecoderOutput(sample=sample) if return_dict else (sample,)

    def forward(self, sample: torch.Tensor, return_dict: bool = True):
        return self.decode(self.encode(sample).latents, return_dict=return_dict)


def load_taef2(folder: str | Path) -> TinyAutoencoderF2:
    """TAEF2 from the published files (:func:`from_published`) or from a model folder's
    ``vae/`` written by :meth:`save_pretrained` (e.g. the shipped ``faces`` model)."""
    folder = Path(folder)
    if (folder / "config.json").is_file():
        from facefuse.core.errors import ModelLoadError
        from facefuse.models.vae import TAEF2, vae_class_name

        if vae_class_name(folder) != TAEF2:
            raise ModelLoadError(f"{folder / 'config.json'}: expected a {TAEF2} VAE")
        return TinyAutoencoderF2.from_pretrained(
            folder, use_safetensors=True, torch_dtype=torch.float32
        ).eval()
    return from_published(folder)


def from_published(folder: str | Path) -> TinyAutoencoderF2:
    """Build the model from ``taef2_encoder.safetensors`` / ``taef2_decoder.safetensors``."""
    from safetensors.torch import load_file

    from facefuse.core.errors import ModelLoadError

    folder = Path(folder)
    model = TinyAutoencoderF2()
    state = {}
    for part in ("encoder", "decoder"):
        path = folder / f"taef2_{part}.safetensors"
        if not path.is_file():
            raise ModelLoadError(f"{path}: expected the TAEF2 {part} weights (safetensors)")
        state.update({f"{part}.{k}": v.float() for k, v in load_file(path).items()})
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a tensor of another shape
        raise ModelLoadError(f"{folder}: not TAEF2 weights ({str(exc)[:200]})") from exc
    if missing or unexpected:
        raise ModelLoadError(
            f"{folder}: not TAEF2 weights (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return model.eval()
