"""Derived model repositories: the same exported artefacts under other configurations.

:func:`naive_repository` builds baseline B of ``facefuse bench e2e``: what a deployment that
follows NVIDIA's examples looks like - no dynamic batching, one instance per model, DDIM,
the fp32 UNet (the default serves INT8 through ``onnx_file``), no prompt compression, no
prefix cache. Artefacts are symlinked, never copied.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from facefuse.export import configs
from facefuse.export.configs import set_parameter

ARTEFACT_SUFFIXES = (".onnx", ".data", ".json")


def _copy_model(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    for item in src.iterdir():
        target = dst / item.name
        if item.is_dir() and item.name == "1":
            target.mkdir()
            for inner in item.iterdir():
                if inner.name == "__pycache__":
                    continue
                if (
                    inner.is_dir()
                    or inner.suffix in ARTEFACT_SUFFIXES
                    or inner.name.endswith(".onnx.data")
                ):
                    target.joinpath(inner.name).symlink_to(inner.resolve())
                else:
                    shutil.copy2(inner, target / inner.name)
        elif item.is_dir():
            shutil.copytree(item, target)
        else:
            shutil.copy2(item, target)


def copy_repository_sources(
    source: str | Path, destination: str | Path, refresh: bool = False
) -> Path:
    """Copy the versioned part of a model repository (configs, model.py), no artefacts.

    ``refresh``: ``destination`` may exist (an earlier export); its configs and model.py are
    overwritten with the source's, its exported artefacts kept."""
    shutil.copytree(
        source,
        destination,
        # everything `facefuse export` writes (ONNX, engines, pipeline.json, the KV-graph
        # manifest, the tokenizer); a refresh must never carry another model's artefacts over
        ignore=shutil.ignore_patterns(
            "*.onnx", "*.onnx.data", "*.plan", "*.json", "tokenizer", "__pycache__"
        ),
        dirs_exist_ok=refresh,
    )
    return Path(destination)


def naive_repository(source: str | Path, destination: str | Path) -> Path:
    """Write baseline B's repository at ``destination`` from an exported ``source``.

    Baseline B is what a naive deployment runs: no dynamic batching, one instance per model,
    DDIM 50 img2img from seeded noise (no inversion: less UNet work than facefuse's default,
    like baseline A), the fp32 UNet at every step (no DeepCache), no prompt compression, no prefix
    cache, every graph on ONNX Runtime (no OpenVINO), and each UNet call as one ONNX Runtime
    run on all threads (facefuse's row slices, ``parallel_runs``, are off)."""
    from facefuse.runtime.variants import DEEP_CACHE_MODELS

    source, destination = Path(source), Path(destination)
    if destination.exists():
        shutil.rmtree(destination)
    for model in sorted(p for p in source.iterdir() if (p / "config.pbtxt").is_file()):
        if model.name in DEEP_CACHE_MODELS:
            continue
        _copy_model(model, destination / model.name)
        config_path = destination / model.name / "config.pbtxt"
        config = configs.single_instance(
            configs.without_dynamic_batching(configs.read(config_path))
        )
        if model.name in ("facefusion", "txt2img"):
            set_parameter(config, "scheduler", "ddim")
            set_parameter(config, "deep_cache_interval", "1")
            set_parameter(config, "default_steps", "50")
            if model.name == "facefusion":
                set_parameter(config, "inversion", "false")
        if model.name == "prompt_optimizer":
            set_parameter(config, "compress", "false")
        if model.name == "unet":
            set_parameter(config, "onnx_file", "model.onnx")
            set_parameter(config, "parallel_runs", "1")
        if model.name == "text_encoder":
            set_parameter(config, "cache_budget_bytes", "0")
        if "runtime" in config.parameters:  # the export's own runtime: ONNX Runtime
            del config.parameters["runtime"]
        configs.write(
            config, config_path, f"facefuse.export.variants.naive_repository from {source}"
        )
    return destination
