"""``facefuse txt2img-eval``'s measures, on real photos (the meter is dlib's) and a stand-in
for the served model (face crops of packaged photos, a grey copy, a blank picture)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from facefuse.core.errors import InvalidInput
from facefuse.core.samples import astronaut_png, grace_hopper_jpeg
from facefuse.face.imageio import decode_image
from facefuse.quality import txt2img_eval as te


def test_greyness_is_zero_for_grey_and_large_for_colour():
    rng = np.random.default_rng(0)
    colour = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    grey = np.repeat(colour[..., :1], 3, axis=2)
    assert te.greyness(grey) == 0.0
    assert te.greyness(colour) > 20
    with pytest.raises(ValueError, match="RGB"):
        te.greyness(colour[..., 0])


def test_enlarge_only_grows_and_keeps_the_aspect():
    small = np.zeros((64, 128, 3), np.uint8)
    assert te.enlarge(small).shape == (128, 256, 3)
    big = np.zeros((512, 300, 3), np.uint8)
    assert te.enlarge(big) is big


def test_nearest_distance():
    bank = np.array([[0.0, 0.0], [3.0, 4.0]])
    assert te.nearest_distance(np.array([3.0, 5.0]), bank) == pytest.approx(1.0)
    assert te.nearest_distance(np.array([1.0, 1.0]), np.zeros((0, 2))) is None


def _crop(rgb: np.ndarray, side: int = 128) -> np.ndarray:
    """A 128 px face crop, as txt2img returns."""
    height, width = rgb.shape[:2]
    s = min(height, width)
    y, x = (height - s) // 2, (width - s) // 2
    return cv2.resize(rgb[y : y + s, x : x + s], (side, side), interpolation=cv2.INTER_AREA)


def test_evaluate_finds_faces_greyness_and_the_smile_gain():
    astronaut = _crop(decode_image(astronaut_png(), "astronaut"))
    hopper = _crop(decode_image(grace_hopper_jpeg(), "hopper"))
    grey_hopper = np.repeat(cv2.cvtColor(hopper, cv2.COLOR_RGB2GRAY)[..., None], 3, axis=2)
    drawn = {
        te.SMILE_PROMPT: astronaut,  # the astronaut smiles with her mouth wide
        te.NEUTRAL_PROMPT: hopper,
        te.GREY_PROMPT: grey_hopper,
        "blank": np.full((128, 128, 3), 90, np.uint8),
    }
    calls = []

    def generate(prompt: str, seed: int) -> np.ndarray:
        calls.append((prompt, seed))
        return drawn[prompt]

    prompts = list(drawn)
    report, rows = te.evaluate(generate, prompts, [3, 5])
    assert calls == [(p, s) for p in prompts for s in (3, 5)]
    assert len(rows) == 4 and all(len(r) == 2 for r in rows)
    summary = report["summary"]
    per = summary["per_prompt"]
    assert per["blank"]["face_found"] == 0.0
    assert per[te.SMILE_PROMPT]["face_found"] == per[te.NEUTRAL_PROMPT]["face_found"] == 1.0
    assert per[te.GREY_PROMPT]["grey"] == 1.0 and per[te.NEUTRAL_PROMPT]["grey"] == 0.0
    assert summary["min_face_found_per_prompt"] == 0.0
    assert summary["smile_vs_neutral"]["seeds_with_both_faces"] == 2
    # no training bank given: no near-copy figure
    assert summary["near_copies"] is None
    # with the neutral picture as the only "training photo", its own samples are copies
    from facefuse.quality.fusion_eval import FaceMeter

    meter = FaceMeter()
    bank = np.stack([meter.main_face(te.enlarge(hopper)).descriptor])
    report, _ = te.evaluate(generate, [te.NEUTRAL_PROMPT, te.SMILE_PROMPT], [1], meter, bank)
    assert report["summary"]["near_copies"] == 0.5


def test_evaluate_needs_prompts_and_seeds():
    with pytest.raises(InvalidInput, match="--prompts/--seeds"):
        te.evaluate(lambda p, s: None, [], [1])


def test_command_refuses_bad_options(capsys, tmp_path):
    from facefuse.cli import main

    assert main(["txt2img-eval", "--seeds", "1,x", "--out", str(tmp_path)]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(["txt2img-eval", "--prompts", " | ", "--out", str(tmp_path)]) == 2
    assert "--prompts" in capsys.readouterr().err
    missing = str(tmp_path / "none")
    assert main(["txt2img-eval", "--repository", missing, "--out", str(tmp_path)]) == 2
    assert "--repository" in capsys.readouterr().err
