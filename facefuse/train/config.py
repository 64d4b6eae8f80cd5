"""The configuration of a training run (no torch import: ``facefuse --help`` reads its fields)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from facefuse.core.errors import InvalidInput


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a run; a checkpoint is only resumed under an equal config."""

    size: int = 128
    steps: int = 4000
    batch: int = 16
    lr: float = 3e-4
    warmup: int = 200
    seed: int = 0
    heldout: int = 16
    augmentations: int = 3  # augmented crops per photo, besides the plain one
    unet_channels: tuple[int, ...] = (64, 128, 128)
    layers_per_block: int = 1
    attention_heads: int = 8
    text_hidden: int = 32
    text_layers: int = 2
    text_heads: int = 4
    cond_dropout: float = 0.1
    ema_decay: float = 0.999
    snr_gamma: float = 5.0
    checkpoint_every: int = 250

    def __post_init__(self):
        if self.size < 64 or self.size % 8:
            raise InvalidInput(
                "--size", f"must be a multiple of 8 and at least 64, got {self.size}"
            )
        if self.steps < 1 or self.batch < 1:
            raise InvalidInput("--steps/--batch", "must be at least 1")

    @property
    def latent_size(self) -> int:
        return self.size // 8

    def as_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))  # tuples become lists, as in JSON
