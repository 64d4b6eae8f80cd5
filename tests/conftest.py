"""Shared fixtures: the tiny model exported once per session into a private repository copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_REPOSITORY = ROOT / "model_repository"


def copy_repository_sources(destination: Path) -> Path:
    """Copy the versioned part of the model repository (configs, model.py), no artefacts."""
    shutil.copytree(
        SOURCE_REPOSITORY,
        destination,
        ignore=shutil.ignore_patterns(
            "*.onnx", "*.onnx.data", "pipeline.json", "tokenizer", "__pycache__"
        ),
    )
    return destination


@pytest.fixture(scope="session")
def tiny_components():
    from facefuse.models.loading import load_components

    return load_components("tiny")


@pytest.fixture(scope="session")
def tiny_repository(tmp_path_factory, tiny_components) -> Path:
    """A model repository with the tiny model exported into it (fresh for this session)."""
    from facefuse.export.repository import export_repository

    repository = copy_repository_sources(tmp_path_factory.mktemp("repo") / "model_repository")
    results = export_repository(tiny_components, repository)
    assert all(r.ok for r in results), [(r.name, r.max_abs_diff) for r in results]
    return repository


@pytest.fixture(scope="session")
def sample_images() -> tuple[bytes, bytes]:
    from facefuse.samples import sample_pair

    return sample_pair()
