"""forehead_occlusion: A's fringe over its forehead is not pasted; brows and glasses stay."""

from __future__ import annotations

import numpy as np

from facefuse.face.mask import forehead_occlusion

SKIN = np.array([0.85, 0.65, 0.55], np.float32)
HAIR = np.array([0.15, 0.10, 0.08], np.float32)
EYES = ((40.0, 60.0), (88.0, 60.0))  # eye distance 48 px, eye line at y 60


def _face(fringe_to: int | None) -> tuple[np.ndarray, np.ndarray]:
    face = np.tile(SKIN, (128, 128, 1))
    face[46:50, 32:56] = HAIR  # brows, 0.21-0.29 eye distances above the eye line
    face[46:50, 72:96] = HAIR
    if fringe_to is not None:
        face[:fringe_to, 20:108] = HAIR  # a fringe from the top down to y = fringe_to
        face[fringe_to - 4 : fringe_to, 24:104:8] = SKIN  # skin between its tips
    region = np.zeros((128, 128), bool)
    region[20:120, 20:108] = True
    return face, region


def test_a_fringe_and_its_tips_go_the_brows_stay():
    face, region = _face(fringe_to=38)  # tips 0.46 eye distances above the eye line
    keep = forehead_occlusion(face, EYES, region)
    assert keep.dtype == np.float32 and keep.min() >= 0.0 and keep.max() <= 1.0
    assert keep[10:34, 30:100].max() < 0.05  # the fringe, and the skin between its tips
    assert keep[48, 36:52].min() > 0.9 and keep[48, 76:92].min() > 0.9  # brows kept
    assert keep[70:, :].min() == 1.0  # below the eyes nothing changes


def test_no_hair_keeps_everything_and_degenerate_eyes_are_refused_softly():
    face, region = _face(fringe_to=None)
    assert forehead_occlusion(face, EYES, region).min() == 1.0
    assert forehead_occlusion(face, ((50.0, 60.0), (50.5, 60.0)), region).min() == 1.0
    assert forehead_occlusion(face, EYES, np.zeros((128, 128), bool)).min() == 1.0
