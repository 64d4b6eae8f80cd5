"""Eye (and nose) positions inside a detected face box, best source first.

1. dlib's 5-point predictor (``"landmarks5"``): points 0-1 are the outer/inner corners of the
   eye on the image's right, 2-3 those of the eye on the image's left, 4 the base of the nose.
2. OpenCV's Haar eye cascade in the upper half of the box (``"haar-eyes"``).
3. A geometric estimate from the box (``"geometric"``), which always succeeds.

All coordinates are ``(x, y)`` floats in the pixel frame of the gray image given, with the face
upright in that frame. ``left`` is the eye on the image's left.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from facefuse.core.errors import ModelLoadError
from facefuse.face import models

# Where the eyes and nose sit in an upright face box, per detector (fractions of width and
# height from the top-left), measured on dlib 5-point landmarks; the boxes differ by detector.
GEOMETRIC = {
    "hog": ((0.29, 0.25), (0.71, 0.25), (0.5, 0.55)),
    "haar": ((0.29, 0.38), (0.72, 0.38), (0.5, 0.65)),
    "mmod": ((0.35, 0.32), (0.75, 0.32), (0.55, 0.6)),
}


@dataclass(frozen=True)
class EyePoints:
    """Eye centres, optional nose and 5 landmarks, and which method produced them."""

    left: tuple[float, float]
    right: tuple[float, float]
    nose: tuple[float, float] | None
    points5: tuple[tuple[float, float], ...] | None
    source: str


def from_landmarks5(gray: np.ndarray, rect: tuple[float, float, float, float]) -> EyePoints:
    """Run the 5-point predictor on ``rect`` = (x0, y0, x1, y1)."""
    predictor = models.landmarks5()
    x0, y0, x1, y1 = (round(v) for v in rect)
    shape = predictor(gray, models.dlib.rectangle(x0, y0, x1, y1))
    points = tuple((float(p.x), float(p.y)) for p in shape.parts())
    right = _mean(points[0], points[1])
    left = _mean(points[2], points[3])
    return EyePoints(left, right, points[4], points, "landmarks5")


def from_haar_eyes(gray: np.ndarray, rect: tuple[float, float, float, float]) -> EyePoints | None:
    """Find one eye in each upper quarter of the box with the Haar eye cascade, else None."""
    x0, y0, x1, y1 = _clip_rect(rect, gray.shape)
    width, height = x1 - x0, y1 - y0
    if width < 20 or height < 20:
        return None
    upper = gray[y0 : y0 + height * 6 // 10, x0:x1]
    min_side = max(8, width // 10)
    found = models.haar_eye().detectMultiScale(
        upper, scaleFactor=1.1, minNeighbors=4, minSize=(min_side, min_side)
    )
    centre_x = width / 2
    halves: dict[str, tuple[float, tuple[float, float]]] = {}
    for ex, ey, ew, eh in found:
        cx, cy = ex + ew / 2, ey + eh / 2
        side = "left" if cx < centre_x else "right"
        if side not in halves or ew * eh > halves[side][0]:
            halves[side] = (ew * eh, (x0 + cx, y0 + cy))
    if len(halves) != 2:
        return None
    return EyePoints(halves["left"][1], halves["right"][1], None, None, "haar-eyes")


def geometric(rect: tuple[float, float, float, float], detector: str = "hog") -> EyePoints:
    """Typical eye and nose positions for an upright face box of ``detector``."""
    x0, y0, x1, y1 = rect
    width, height = x1 - x0, y1 - y0

    def at(fx: float, fy: float) -> tuple[float, float]:
        return (x0 + fx * width, y0 + fy * height)

    left, right, nose = (at(*p) for p in GEOMETRIC.get(detector, GEOMETRIC["hog"]))
    return EyePoints(left, right, nose, None, "geometric")


def locate_eyes(
    gray: np.ndarray, rect: tuple[float, float, float, float], detector: str = "hog"
) -> EyePoints:
    """Eyes from the best available source (see the module docstring); never fails."""
    if models.dlib_available():
        try:
            return from_landmarks5(gray, rect)
        except ModelLoadError:
            pass  # model file absent: fall through to the cascade
    return from_haar_eyes(gray, rect) or geometric(rect, detector)


def _mean(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return ((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)


def _clip_rect(
    rect: tuple[float, float, float, float], shape: tuple[int, ...]
) -> tuple[int, int, int, int]:
    height, width = shape[:2]
    x0, y0, x1, y1 = rect
    return (
        int(np.clip(round(x0), 0, width)),
        int(np.clip(round(y0), 0, height)),
        int(np.clip(round(x1), 0, width)),
        int(np.clip(round(y1), 0, height)),
    )
