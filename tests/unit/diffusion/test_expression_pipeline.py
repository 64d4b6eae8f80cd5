"""The pipeline hands the request's expression fields and the instruction's words to the face
stage and reports what it did (issue 30); without the stage it fuses as before."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np


def _pipeline(seen: list, with_expression: bool = True):
    from facefuse.diffusion.manifest import PipelineManifest
    from facefuse.diffusion.pipeline import Pipeline, Stages
    from facefuse.models.tiny import SD1_SCHEDULER

    size = 64
    composite = np.full((size, size, 3), 0.5, np.float32)
    mask = np.ones((size, size), np.float32)

    def faces(a, b, s):
        seen.append(None)
        return composite, mask, np.array([0, 0, s, s])

    def faces_expression(a, b, s, expression, reference=None):
        seen.append(json.loads(expression))
        return composite, mask, np.array([0, 0, s, s]), {"expression": {"source": "t"}}

    stages = Stages(
        analyze_faces=faces,
        optimize_prompt=lambda text: (np.zeros((1, 77), np.int64), np.zeros((1, 77), np.int64), {}),
        encode_text=lambda ids: (np.zeros((len(ids), 77, 8), np.float32), np.zeros(len(ids))),
        encode_image=lambda image: np.zeros((1, 4, size // 8, size // 8), np.float32),
        unet=lambda sample, t, c: np.zeros_like(sample),
        decode_latents=lambda latents: np.zeros((1, 3, size, size), np.float32),
        analyze_faces_expression=faces_expression if with_expression else None,
    )
    manifest = PipelineManifest("test", size, 8, 8, 0, SD1_SCHEDULER)
    return Pipeline(stages, manifest)


def test_words_and_fields_reach_the_face_stage_and_info():
    from facefuse.diffusion.pipeline import params_from

    seen: list = []
    pipeline = _pipeline(seen)
    params = params_from(steps=2, strength=0.5)
    *_, info = pipeline.fuse(b"a", b"b", "keep a neutral expression", params)
    assert seen[-1]["source"] == "target" and seen[-1]["words"]["reset"] is True
    assert seen[-1]["smile"] is None and info["expression"] == {"source": "t"}
    assert seen[-1]["face_select"] == "largest" and seen[-1]["face_index"] == 0
    *_, info = pipeline.fuse(
        b"a", b"b", "make them smile", params, expression={"source": "source", "smile": 0.5}
    )
    assert seen[-1]["source"] == "source" and seen[-1]["smile"] == 0.5
    assert seen[-1]["words"]["smile"] == 1.0


def test_without_the_expression_stage_the_plain_stage_runs():
    from facefuse.diffusion.pipeline import params_from

    seen: list = []
    pipeline = _pipeline(seen, with_expression=False)
    *_, info = pipeline.fuse(b"a", b"b", "make them smile", params_from(steps=2))
    assert seen == [None] and "expression" not in info
    assert replace(pipeline.stages, analyze_faces_expression=None).analyze_faces_expression is None
