"""Shared fixtures: the tiny model exported once per session into a private repository copy."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_REPOSITORY = ROOT / "model_repository"


@pytest.fixture(scope="session")
def tiny_components():
    from facefuse.models.loading import load_components

    return load_components("tiny")


@pytest.fixture(scope="session")
def tiny_repository(tmp_path_factory, tiny_components) -> Path:
    """A model repository with the tiny model exported into it (fresh for this session)."""
    from facefuse.export.repository import export_repository
    from facefuse.export.variants import copy_repository_sources

    repository = copy_repository_sources(
        SOURCE_REPOSITORY, tmp_path_factory.mktemp("repo") / "model_repository"
    )
    results = export_repository(tiny_components, repository)
    assert all(r.ok for r in results), [(r.name, r.max_abs_diff) for r in results]
    return repository


@pytest.fixture(scope="session")
def sample_images() -> tuple[bytes, bytes]:
    from facefuse.core.samples import sample_pair

    return sample_pair()


# Fixtures that build (and export) the tiny model: tens of seconds the first time in a session.
SLOW_FIXTURES = {"tiny_components", "tiny_repository"}


def pytest_collection_modifyitems(config, items):
    """``slow``: integration tests and every test that needs the tiny model built; the
    fast tier (``make test-fast``) is ``tests/unit -m "not slow"``."""
    for item in items:
        if item.get_closest_marker("integration") or SLOW_FIXTURES & set(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.slow)
