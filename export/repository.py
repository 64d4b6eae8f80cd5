"""Assemble a Triton model repository from a diffusers SD 1.x folder.

Layout written (artefacts are build outputs, ignored by git)::

    REPO/text_encoder/1/model.onnx      REPO/unet/1/model.onnx
    REPO/vae_encoder/1/model.onnx       REPO/vae_decoder/1/model.onnx
    REPO/prompt_optimizer/1/tokenizer/  (the model's own tokenizer)
    REPO/facefusion/1/pipeline.json     REPO/txt2img/1/pipeline.json

Configs and ``model.py`` files are versioned in the repository itself.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from facefuse.export.onnx_export import (
    ExportResult,
    export_text_encoder,
    export_unet,
    export_vae_decoder,
    export_vae_encoder,
)

from facefuse.diffusion.manifest import MANIFEST_NAME, PipelineManifest

PIPELINE_MODELS = ("facefusion", "txt2img")
ONNX_FILE = "model.onnx"


@dataclass(frozen=True)
class RepositoryPaths:
    """Where each artefact of one repository lives."""

    root: Path

    def onnx(self, model: str) -> Path:
        return self.root / model / "1" / ONNX_FILE

    def manifest(self, model: str) -> Path:
        return self.root / model / "1" / MANIFEST_NAME

    @property
    def tokenizer(self) -> Path:
        return self.root / "prompt_optimizer" / "1" / "tokenizer"


def model_identity(folder: Path) -> str:
    """Short content hash of the weights: the prefix cache keys on it."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.safetensors")):
        digest.update(path.relative_to(folder).as_posix().encode())
        digest.update(str(path.stat().st_size).encode())
        with path.open("rb") as handle:
            digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def export_repository(
    components, out: Path, progress: Callable[[str], None] = lambda _: None
) -> list[ExportResult]:
    """Export every graph of ``components`` into ``out`` and write manifests; returns checks."""
    paths = RepositoryPaths(Path(out))
    text_dim = components.text_encoder.config.hidden_size
    latent = components.unet.config.sample_size
    steps: list[tuple[str, Callable[[], ExportResult]]] = [
        (
            "text_encoder",
            lambda: export_text_encoder(components.text_encoder, paths.onnx("text_encoder")),
        ),
        ("unet", lambda: export_unet(components.unet, paths.onnx("unet"), latent, text_dim)),
        (
            "vae_encoder",
            lambda: export_vae_encoder(
                components.vae, paths.onnx("vae_encoder"), components.image_size
            ),
        ),
        (
            "vae_decoder",
            lambda: export_vae_decoder(components.vae, paths.onnx("vae_decoder"), latent),
        ),
    ]
    results = []
    for name, run in steps:
        progress(name)
        results.append(run())
    progress("tokenizer and manifests")
    if paths.tokenizer.exists():
        shutil.rmtree(paths.tokenizer)
    components.tokenizer.save_pretrained(str(paths.tokenizer))
    manifest = PipelineManifest(
        model_id=model_identity(components.path),
        image_size=components.image_size,
        vae_scale_factor=components.vae_scale_factor,
        text_dim=text_dim,
        pad_token_id=int(components.tokenizer.pad_token_id),
        scheduler_config=components.scheduler_config,
    )
    for model in PIPELINE_MODELS:
        paths.manifest(model).parent.mkdir(parents=True, exist_ok=True)
        manifest.save(paths.manifest(model))
    return results
