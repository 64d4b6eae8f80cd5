"""Feathered face masks: 1 inside the face, 0 well outside, a Gaussian ramp in between.

Invariants of :func:`feathered_ellipse`: float32 in [0, 1]; exactly 1 on the ellipse shrunk by
the feather width, exactly 0 beyond the ellipse grown by ~0.5 feather widths, so blending
with it leaves far pixels bit-identical.
"""

from __future__ import annotations

import cv2
import numpy as np

from facefuse.face.geometry import Ellipse

FEATHER = 0.18  # feather width as a fraction of the ellipse's shorter semi-axis
_SHIFT = 4  # sub-pixel bits for cv2.ellipse
_SNAP = 1e-4  # values this close to 0 or 1 are snapped, so "inside" and "outside" are exact


def filled_ellipse(ellipse: Ellipse, shape: tuple[int, int]) -> np.ndarray:
    """Hard 0/1 float32 mask of ``ellipse`` on an image of ``shape`` = (height, width)."""
    canvas = np.zeros(shape, dtype=np.uint8)
    scale = 1 << _SHIFT
    centre = (round(ellipse.centre[0] * scale), round(ellipse.centre[1] * scale))
    axes = (max(0, round(ellipse.axes[0] * scale)), max(0, round(ellipse.axes[1] * scale)))
    cv2.ellipse(canvas, centre, axes, ellipse.angle, 0, 360, 1, -1, cv2.LINE_8, _SHIFT)
    return canvas.astype(np.float32)


def feathered_ellipse(ellipse: Ellipse, shape: tuple[int, int]) -> np.ndarray:
    """Soft mask: the ellipse shrunk by the feather width, then Gaussian-blurred by it."""
    feather = max(1.0, FEATHER * min(ellipse.axes))
    inner = Ellipse(
        ellipse.centre,
        (max(0.0, ellipse.axes[0] - feather), max(0.0, ellipse.axes[1] - feather)),
        ellipse.angle,
    )
    hard = filled_ellipse(inner, shape)
    radius = max(1, round(feather))
    soft = cv2.GaussianBlur(hard, (2 * radius + 1, 2 * radius + 1), radius / 2.0)
    soft = np.clip(soft, 0.0, 1.0)
    soft[soft < _SNAP] = 0.0
    soft[soft > 1.0 - _SNAP] = 1.0
    return soft.astype(np.float32)
