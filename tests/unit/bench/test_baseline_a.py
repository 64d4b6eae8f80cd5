"""Baseline A of ``facefuse bench e2e`` runs on both latent spaces: diffusers' inpainting
pipeline for a 4-channel UNet (tiny), its img2img pipeline for the faces model's 32 channels."""

from __future__ import annotations

import pytest

from facefuse.bench.e2e import Job, run_baseline_a
from facefuse.core.samples import sample_pair


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny", "faces"])
def test_baseline_a_answers_every_request(model):
    results = run_baseline_a(model, [1], [1], Job(*sample_pair(), strength=0.5))
    _, summary = results[1]
    assert summary["failures"] == 0 and summary["requests"] == 1, summary
