"""``pipeline.json``: what the pipeline models need to know about the exported model.

Written by ``facefuse export`` beside each pipeline model; read at ``initialize``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from facefuse.core.errors import ModelLoadError

MANIFEST_NAME = "pipeline.json"


@dataclass(frozen=True)
class PipelineManifest:
    """Sizes and identity of the exported model. ``image_size`` = latent side x scale factor."""

    model_id: str
    image_size: int
    vae_scale_factor: int
    text_dim: int
    pad_token_id: int
    scheduler_config: dict = field(default_factory=dict)
    clip_skip: int = 1
    latent_channels: int = 4  # 32 for TAEF2 (the ``faces`` model)

    @property
    def latent_size(self) -> int:
        return self.image_size // self.vae_scale_factor

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path) -> PipelineManifest:
        path = Path(path)
        if not path.is_file():
            raise ModelLoadError(f"{path}: pipeline manifest not found; run `facefuse export`")
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise ModelLoadError(f"{path}: invalid pipeline manifest ({exc})") from exc
