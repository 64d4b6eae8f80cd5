"""Assemble a Triton model repository from a diffusers SD 1.x folder.

Layout written (artefacts are build outputs, ignored by git)::

    REPO/text_encoder/1/model.onnx      REPO/unet/1/model.onnx
    REPO/unet_deep/1/model.onnx         REPO/unet_shallow/1/model.onnx  (DeepCache pair)
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

from facefuse.export import configs
from facefuse.export.onnx_export import (
    ExportResult,
    export_text_encoder,
    export_unet,
    export_unet_deep_cache,
    export_vae_decoder,
    export_vae_encoder,
)

from facefuse.diffusion.manifest import MANIFEST_NAME, PipelineManifest

PIPELINE_MODELS = ("facefusion", "facefusion_stream", "txt2img")
ONNX_FILE = "model.onnx"
# Raised whenever exported files change meaning, so that cached exports are redone
# (2: the INT8 UNet has its attention fused).
EXPORT_FORMAT = 2


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


def _export_int8_unet(root: Path) -> list[ExportResult]:
    """``unet/1/model.int8.onnx`` (and the DeepCache pair's): attention fused for the CPU,
    then dynamic INT8 on MatMul/Gemm, what ``unet/config.pbtxt`` serves on CPU
    (``onnx_file``); ``facefuse quality`` gates it against the plain fp32 export
    ``model.onnx``. Returns the fusion's parity check (fused fp32 vs ``model.onnx``) for each
    graph whose attention was fused."""
    from facefuse.export.quantize import export_cpu_variant

    return [
        ExportResult(f"{c.path.parent.parent.name} fused vs plain onnx", c.path, *c.fusion_check)
        for c in export_cpu_variant(root, "int8")
        if c.fusion_check is not None
    ]


def _export_kv(text_encoder, folder: Path) -> ExportResult:
    """The prefix/suffix graphs of the exact prefix cache, checked against the full forward."""
    import json

    from facefuse.export.text_encoder_kv import EXACT_TOLERANCE, export_kv_encoder

    paths = export_kv_encoder(text_encoder, folder, verbose=False)  # raises above 1e-5
    diff = json.loads(paths["manifest"].read_text())["max_abs_diff"]
    return ExportResult("text_encoder_kv", paths["suffix"], diff, 1.0, tolerance=EXACT_TOLERANCE)


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
    progress("unet_deep / unet_shallow (DeepCache)")
    results.extend(
        export_unet_deep_cache(
            components.unet, paths.onnx("unet_deep"), paths.onnx("unet_shallow"), latent, text_dim
        )
    )
    progress("unet INT8 (the default CPU serving variant)")
    results.extend(_export_int8_unet(paths.root))
    progress("text_encoder prefix-KV graphs")
    results.append(_export_kv(components.text_encoder, paths.onnx("text_encoder").parent))
    progress("tokenizer and manifests")
    if paths.tokenizer.exists():
        shutil.rmtree(paths.tokenizer)
    components.tokenizer.save_pretrained(str(paths.tokenizer))
    manifest = PipelineManifest(
        model_id=model_identity(components.path),
        image_size=components.image_size,
        vae_scale_factor=components.vae_scale_factor,
        latent_channels=components.latent_channels,
        text_dim=text_dim,
        pad_token_id=int(components.tokenizer.pad_token_id),
        scheduler_config=components.scheduler_config,
    )
    for model in PIPELINE_MODELS:
        paths.manifest(model).parent.mkdir(parents=True, exist_ok=True)
        manifest.save(paths.manifest(model))
    return results


def write_variant_models(root: Path, precision: str) -> list[Path]:
    """Generate ``<model>_<precision>`` folders serving ``precision`` beside the base models.

    They exist for A/B routing and FP32 fallback (a pipeline calls ``unet_int8`` instead of
    ``unet``). Nothing is copied: ``1/`` holds symlinks to the base model's variant file and
    its external data, and ``model.py``; ``config.pbtxt`` (and ``configs/*.pbtxt``) are the
    base model's with the name replaced and ``onnx_file`` / ``default_model_filename``
    pointing at the variant file.
    """
    import os

    from facefuse.runtime.variants import VARIANT_MODELS, onnx_file, variant_model_name

    root = Path(root)
    written = []
    file = onnx_file(precision)
    for model in VARIANT_MODELS[precision]:
        base = root / model
        name = variant_model_name(model, precision)
        folder = root / name
        if folder.exists():
            shutil.rmtree(folder)
        (folder / "1").mkdir(parents=True)
        graph = base / "1" / file
        if not graph.is_file():
            raise FileNotFoundError(f"{graph}: variant {precision} of {model} not exported")
        links = [graph, graph.with_name(graph.name + ".data"), base / "1" / "model.py"]
        for source in links:
            if source.exists():
                target = folder / "1" / source.name
                target.symlink_to(os.path.relpath(source, target.parent))
        config_files = [base / "config.pbtxt", *sorted((base / "configs").glob("*.pbtxt"))]
        for config in config_files:
            if not config.is_file():
                continue
            edited = configs.read(config)
            edited.name = name
            if edited.default_model_filename:
                edited.default_model_filename = file
            if edited.platform == "tensorrt_plan":
                edited.platform = "onnxruntime_onnx"
            configs.remove_parameter(edited, "onnx_file")
            if edited.backend == "python":
                configs.set_parameter(edited, "onnx_file", file)
            if configs.get_parameter(edited, "runtime") == "auto":  # a variant serves its file
                configs.set_parameter(edited, "runtime", "onnxruntime")
            configs.write(
                edited,
                folder / config.relative_to(base),
                f"facefuse export --variant-models from {model}/{config.relative_to(base)}",
            )
        written.append(folder)
    return written
