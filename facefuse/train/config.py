"""The configuration of a training run (no torch import: ``facefuse --help`` reads its fields)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from facefuse.core.errors import InvalidInput

PREDICTIONS = ("epsilon", "v_prediction")
# model_repository/prompt_optimizer's prompt_template (a unit test keeps the two equal)
SERVED_TEMPLATE = "portrait photo, detailed face, natural skin texture, sharp focus"


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
    # the served prompt_optimizer's prompt_template, put before this share of the captions
    # ("TEMPLATE, caption", exactly as served), so the tower learns to read past the prefix
    # that the text encoder's cache serves; the rest are trained bare
    template: str = SERVED_TEMPLATE
    template_share: float = 0.8
    # share of captions of any set that start with a generic portrait word ("portrait photo",
    # "headshot"), so those words are not tied to one (the smallest, messiest) set
    generic_share: float = 0.3
    # sampling weight of grey copies of the colour photos, captioned as black and white
    # (0: none are made)
    grey_share: float = 0.15
    # a model folder to start from (its UNet, text tower and latent shift/scale), "" for scratch
    init_from: str = ""

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
        for name in ("template_share", "generic_share", "grey_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                flag = "--" + name.replace("_", "-")
                raise InvalidInput(flag, f"must be within 0..1, got {getattr(self, name)}")

    @property
    def latent_size(self) -> int:
        return self.size // 8

    def scheduler_config(self) -> dict:
        """The SD 1.x scheduler config of the model folder, with this run's target."""
        from facefuse.models.tiny import SD1_SCHEDULER

        return {**SD1_SCHEDULER, "prediction_type": self.prediction}

    def as_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))  # tuples become lists, as in JSON
