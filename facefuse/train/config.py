"""The configuration of a training run (no torch import: ``facefuse --help`` reads its fields)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from facefuse.core.errors import InvalidInput

PREDICTIONS = ("epsilon", "v_prediction")


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
    prediction: str = "v_prediction"  # the UNet's target: "epsilon" or "v_prediction"
    # img2img starts at t = strength * 1000 (the served strengths are <= 0.6): this share of
    # training timesteps is drawn below focus_timestep, the rest over the whole schedule
    focus_timestep: int = 700
    focus_share: float = 0.75

    def __post_init__(self):
        if self.size < 64 or self.size % 8:
            raise InvalidInput(
                "--size", f"must be a multiple of 8 and at least 64, got {self.size}"
            )
        if self.steps < 1 or self.batch < 1:
            raise InvalidInput("--steps/--batch", "must be at least 1")
        if self.prediction not in PREDICTIONS:
            raise InvalidInput(
                "--prediction", f"must be one of {PREDICTIONS}, got {self.prediction!r}"
            )
        if not 1 <= self.focus_timestep <= 1000 or not 0.0 <= self.focus_share <= 1.0:
            raise InvalidInput("--focus-timestep/--focus-share", "must be within 1..1000 and 0..1")

    @property
    def latent_size(self) -> int:
        return self.size // 8

    def scheduler_config(self) -> dict:
        """The SD 1.x scheduler config of the model folder, with this run's target."""
        from facefuse.models.tiny import SD1_SCHEDULER

        return {**SD1_SCHEDULER, "prediction_type": self.prediction}

    def as_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))  # tuples become lists, as in JSON
