"""Pure geometry of a face: similarity transforms, the face ellipse and the square crop box.

Conventions: points are ``(x, y)`` in pixels, y pointing down; transforms are 2x3 float64
matrices acting on column vectors ``[x, y, 1]``; boxes are (x0, y0, x1, y1), x1/y1 exclusive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The face ellipse in units of the eye distance d, relative to the eye midpoint:
# its centre lies CENTRE_DOWN * d below the eyes, its semi-axes are ACROSS * d along the eye
# line and ALONG * d perpendicular to it (eyebrows to chin).
CENTRE_DOWN = 0.55
ACROSS = 1.05
ALONG = 1.4
# Side of the square crop, in units of the ellipse's longer semi-axis.
CROP_FACTOR = 3.0


def similarity_transform(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least-squares rotation + uniform scale + translation mapping ``source`` onto ``target``.

    Umeyama's closed form (no reflection); exact for two distinct points.
    """
    src = np.asarray(source, dtype=np.float64).reshape(-1, 2)
    dst = np.asarray(target, dtype=np.float64).reshape(-1, 2)
    if src.shape != dst.shape or len(src) < 2:
        raise ValueError("similarity_transform needs two equal lists of at least 2 points")
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)
    src_c, dst_c = src - src_mean, dst - dst_mean
    variance = (src_c**2).sum() / len(src)
    if variance <= 1e-12:
        raise ValueError("similarity_transform: source points coincide")
    covariance = dst_c.T @ src_c / len(src)
    u, singular, vt = np.linalg.svd(covariance)
    sign = np.eye(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        sign[1, 1] = -1
    rotation = u @ sign @ vt
    scale = np.trace(np.diag(singular) @ sign) / variance
    matrix = np.empty((2, 3), dtype=np.float64)
    matrix[:, :2] = scale * rotation
    matrix[:, 2] = dst_mean - matrix[:, :2] @ src_mean
    return matrix


def apply(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Apply a 2x3 affine matrix to (k, 2) points."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    return points @ matrix[:, :2].T + matrix[:, 2]


def compose(outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """The 2x3 matrix of ``outer(inner(p))``."""
    full = np.vstack([inner, [0.0, 0.0, 1.0]])
    return outer @ full


@dataclass(frozen=True)
class Ellipse:
    """A rotated ellipse: centre (x, y), semi-axes (across, along), angle in degrees."""

    centre: tuple[float, float]
    axes: tuple[float, float]
    angle: float

    def mapped(self, matrix: np.ndarray) -> Ellipse:
        """The ellipse under a similarity transform ``matrix`` (2x3)."""
        scale = math.sqrt(abs(np.linalg.det(matrix[:, :2])))
        rotation = math.degrees(math.atan2(matrix[1, 0], matrix[0, 0]))
        (cx, cy) = apply(matrix, np.asarray(self.centre))[0]
        return Ellipse(
            (float(cx), float(cy)),
            (self.axes[0] * scale, self.axes[1] * scale),
            self.angle + rotation,
        )


def face_ellipse(left_eye: tuple[float, float], right_eye: tuple[float, float]) -> Ellipse:
    """The face region (eyebrows to chin, cheek to cheek) implied by the two eye centres."""
    left, right = np.asarray(left_eye, np.float64), np.asarray(right_eye, np.float64)
    distance = float(np.linalg.norm(right - left))
    if distance < 1e-6:
        raise ValueError("face_ellipse: the eyes coincide")
    along_eyes = (right - left) / distance
    down = np.array([-along_eyes[1], along_eyes[0]])  # eye line turned 90 deg towards the chin
    centre = (left + right) / 2 + CENTRE_DOWN * distance * down
    angle = math.degrees(math.atan2(along_eyes[1], along_eyes[0]))
    return Ellipse(
        (float(centre[0]), float(centre[1])), (ACROSS * distance, ALONG * distance), angle
    )


def crop_box(ellipse: Ellipse, image_shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Square box around the face ellipse with a margin, inside the image whenever it fits.

    The side is ``CROP_FACTOR`` times the longer semi-axis, capped at the image's shorter side
    but never below the ellipse's bounding square; the box is shifted to lie inside the image.
    Only when even that minimum does not fit does the box extend past the border (the caller
    pads there).
    """
    height, width = image_shape[:2]
    longest = max(ellipse.axes)
    side = min(CROP_FACTOR * longest, float(min(height, width)))
    side = max(side, 2.0 * longest, 8.0)
    side_px = max(8, round(side))
    cx, cy = ellipse.centre
    x0 = round(cx - side_px / 2)
    y0 = round(cy - side_px / 2)
    if side_px <= width:
        x0 = min(max(x0, 0), width - side_px)
    if side_px <= height:
        y0 = min(max(y0, 0), height - side_px)
    return (int(x0), int(y0), int(x0 + side_px), int(y0 + side_px))


def box_to_square(box: tuple[int, int, int, int], size: int) -> np.ndarray:
    """2x3 matrix from image pixels to the ``size`` x ``size`` pixels of the resized box.

    Pixel centres map to pixel centres, as in ``cv2.resize`` of the box's pixels.
    """
    x0, y0, x1, y1 = box
    sx, sy = size / (x1 - x0), size / (y1 - y0)
    return np.array(
        [[sx, 0.0, (0.5 - x0) * sx - 0.5], [0.0, sy, (0.5 - y0) * sy - 0.5]], dtype=np.float64
    )
