"""Load the components of a diffusers SD 1.x folder: the tiny model or a user's checkpoint.

Only safetensors weights are accepted (no pickle): ``from_pretrained`` is called with
``use_safetensors=True``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from facefuse.core.errors import ModelLoadError

SEEDED_NAMES = ("tiny", "mid")  # seeded random-weight models built on first use
# trained models shipped inside the package (facefuse/models/<name>/)
EMBEDDED_NAMES = ("faces",)
DEFAULT_MODEL = "faces"
REQUIRED = ("unet", "vae", "text_encoder", "tokenizer", "scheduler")


@dataclass
class Components:
    """PyTorch components of one model, in eval mode, fp32 on CPU."""

    path: Path
    text_encoder: object
    unet: object
    vae: object
    tokenizer: object
    scheduler_config: dict

    @property
    def vae_scale_factor(self) -> int:
        from facefuse.models.vae import scale_factor

        return scale_factor(self.vae)

    @property
    def latent_channels(self) -> int:
        return int(self.unet.config.in_channels)

    @property
    def image_size(self) -> int:
        """Pixel side of the square the UNet was trained at (512 for SD 1.5)."""
        return self.unet.config.sample_size * self.vae_scale_factor


def embedded_model(name: str) -> Path:
    """The folder of a trained model shipped in the package (``faces``)."""
    return Path(__file__).parent / name


def resolve_model(model: str | Path, cache_dir: str | Path = ".cache/models") -> Path:
    """``"faces"``: the shipped trained model; ``"tiny"``/``"mid"``: build (once) and return a
    seeded model folder; a path is checked."""
    if str(model) in EMBEDDED_NAMES:
        folder = embedded_model(str(model))
        if not (folder / "model_index.json").is_file():
            raise ModelLoadError(f"{folder}: the embedded {model!r} model is missing")
        return folder
    if str(model) in SEEDED_NAMES:
        from facefuse.models.tiny import NAMED_SHAPES, save_model

        folder = Path(cache_dir) / str(model)
        if not (folder / "model_index.json").exists():
            save_model(folder, NAMED_SHAPES[str(model)])
        return folder
    folder = Path(model)
    missing = [name for name in REQUIRED if not (folder / name).is_dir()]
    if missing:
        raise ModelLoadError(
            f"--model {folder}: expected a diffusers SD 1.x folder with subfolders "
            f"{', '.join(REQUIRED)}; missing {', '.join(missing)}"
        )
    return folder


def load_components(model: str | Path) -> Components:
    """Load every component of ``model`` (a name or a diffusers folder), fp32 eval mode.

    Weights stored in fp16 (the shipped ``faces`` model) are loaded as fp32."""
    import json

    import torch
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextModel

    from facefuse.models.vae import load_vae
    from facefuse.prompt.tokenizer import load_tokenizer

    folder = resolve_model(model)
    kwargs = {"use_safetensors": True}
    text_encoder = CLIPTextModel.from_pretrained(folder / "text_encoder", **kwargs)
    unet = UNet2DConditionModel.from_pretrained(folder / "unet", **kwargs)
    return Components(
        path=folder,
        text_encoder=text_encoder.to(torch.float32).eval(),
        unet=unet.to(torch.float32).eval(),
        vae=load_vae(folder / "vae"),
        tokenizer=load_tokenizer(folder),
        scheduler_config=json.loads((folder / "scheduler" / "scheduler_config.json").read_text()),
    )
