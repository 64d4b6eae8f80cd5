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


def feathered_ellipse(
    ellipse: Ellipse, shape: tuple[int, int], feather: float = FEATHER
) -> np.ndarray:
    """Soft mask: the ellipse shrunk by the feather width (``feather`` x its shorter
    semi-axis, at least 1 px), then Gaussian-blurred by it."""
    if not 0.0 < feather < 1.0:
        raise ValueError(f"feather must be in (0, 1), got {feather}")
    feather = max(1.0, feather * min(ellipse.axes))
    inner = Ellipse(
        ellipse.centre,
        (max(0.0, ellipse.axes[0] - feather), max(0.0, ellipse.axes[1] - feather)),
        ellipse.angle,
    )
    return _soften(filled_ellipse(inner, shape), feather)


def _soften(hard: np.ndarray, width: float) -> np.ndarray:
    """A hard 0/1 mask Gaussian-blurred over ``width`` pixels, float32 in [0, 1], snapped."""
    radius = max(1, round(width))
    soft = cv2.GaussianBlur(hard.astype(np.float32), (2 * radius + 1,) * 2, radius / 2.0)
    soft = np.clip(soft, 0.0, 1.0)
    soft[soft < _SNAP] = 0.0
    soft[soft > 1.0 - _SNAP] = 1.0
    return soft.astype(np.float32)


# The paste grows past the face ellipse to A's own outline (issue 30): the ellipse's width and
# its reach below the brows times PASTE_GROWTH (its top stays), cut to A's FaceMesh face oval
# moved into the crop, so A's cheeks and jaw replace B's and A's background never shows. On 16
# held-out pairs (composites, no diffusion) d(A) went 0.45 -> 0.34 at 1.15.
PASTE_GROWTH = 1.15


def paste_mask(
    ellipse: Ellipse,
    outline: np.ndarray,
    shape: tuple[int, int],
    feather: float = FEATHER,
    growth: float = PASTE_GROWTH,
) -> np.ndarray:
    """Soft mask of A's pasted face: :func:`feathered_ellipse` of ``ellipse`` grown by ``growth``
    (across, and down from its unchanged top) times the polygon ``outline`` ((N, 2) pixels, A's
    face outline where the warp put it) blurred over the same feather width (0.5 on the outline).

    float32 in [0, 1]; with an outline around the grown ellipse it is never below
    :func:`feathered_ellipse` of ``ellipse`` and equals it at ``growth`` 1; 0 outside the
    outline."""
    if growth < 1.0:
        raise ValueError(f"paste_mask: growth must be >= 1, got {growth}")
    outline = np.asarray(outline, dtype=np.float64)
    if outline.ndim != 2 or outline.shape[1] != 2 or len(outline) < 3:
        raise ValueError(f"paste_mask: outline must be (N >= 3, 2) points, got {outline.shape}")
    across, along = ellipse.axes
    angle = np.radians(ellipse.angle)
    down = np.array([-np.sin(angle), np.cos(angle)])  # the ellipse's "along" axis, brow to chin
    centre = np.asarray(ellipse.centre, np.float64) + (growth - 1.0) * along * down
    grown = Ellipse((float(centre[0]), float(centre[1])), (across * growth, along * growth),
                    ellipse.angle)  # fmt: skip
    soft = np.maximum(  # the same ramp width in pixels; never less than the ellipse's own
        feathered_ellipse(grown, shape, feather / growth),
        feathered_ellipse(ellipse, shape, feather),
    )
    hard = np.zeros(shape, np.uint8)
    cv2.fillPoly(hard, [np.round(outline).astype(np.int32)], 1)
    return np.minimum(soft, _soften(hard, max(1.0, feather * min(ellipse.axes))))


def upper_face_weight(
    mask: np.ndarray, hold: float, band: float = 0.25, split: float = 0.0
) -> np.ndarray:
    """Per-pixel share of the run's strength: ``hold`` over the upper face, 1 over the lower.

    The face's axes are read from the mask itself (centroid and principal axes of its
    moments: the longer axis runs brow to chin, taken pointing down the image), so the map
    follows tilted faces. The split is the line across the face ``split`` semi-axes below the
    ellipse centre; at 0 it runs between the nose and the mouth (the eyes lie 0.55 eye
    distances above the centre, the mouth about 0.45 below). ``band`` (in semi-axis units)
    smooths the step.
    Returns float32 of the mask's shape in [hold, 1]; all ones when ``hold >= 1`` or the mask is
    empty.
    """
    weight = np.ones(mask.shape, dtype=np.float32)
    if hold >= 1.0:
        return weight
    if not 0.0 <= hold < 1.0:
        raise ValueError(f"upper_face_weight: hold must be in [0, 1], got {hold}")
    m = cv2.moments(np.asarray(mask, np.float32))
    if m["m00"] <= 1e-6:
        return weight
    cx, cy = m["m10"] / m["m00"], m["m01"] / m["m00"]
    cov = np.array([[m["mu20"], m["mu11"]], [m["mu11"], m["mu02"]]]) / m["m00"]
    values, vectors = np.linalg.eigh(cov)
    down = vectors[:, int(np.argmax(values))]
    if down[1] < 0:
        down = -down
    semi = 2.0 * np.sqrt(max(values.max(), 1e-6))  # a filled ellipse's variance is axis^2 / 4
    ys, xs = np.mgrid[0 : mask.shape[0], 0 : mask.shape[1]].astype(np.float32)
    v = ((xs - cx) * down[0] + (ys - cy) * down[1]) / semi
    ramp = np.clip((v - split) / band + 0.5, 0.0, 1.0)  # 0 above the band, 1 below it
    return (hold + (1.0 - hold) * ramp).astype(np.float32)


# Forehead occlusion (A's fringe, issue 30). Heights in eye distances above the eye line.
OCCLUSION_DELTA_E = (18.0, 30.0)  # CIE76 distance to A's skin colour: hair above / certain above
OCCLUSION_SEED = 0.6  # hair comes from above this height (not brows)...
OCCLUSION_REACH = 0.33  # ...and is followed down to here (a fringe's tips, above the brows)
OCCLUSION_FRINGE = 0.5  # only hair reaching below this between the eyes is a fringe: a hairline
OCCLUSION_MIDDLE = 0.5  # stays A's (removing every hairline: nearer A 94% -> 81% held out);
# "between the eyes": within this many eye distances of the midpoint (hair always comes low
# at the temples)


def forehead_occlusion(
    face01: np.ndarray, eyes: tuple[tuple[float, float], tuple[float, float]], region: np.ndarray
) -> np.ndarray:
    """Per-pixel weight in [0, 1] of ``face01`` (float RGB) to keep: 0 on hair over the
    forehead, 1 elsewhere. Hair: a connected area of pixels farther than
    ``OCCLUSION_DELTA_E[0]`` from the skin colour (the median over ``region``, boolean, below
    the eyes: cheeks and nose), no lower than ``OCCLUSION_REACH`` eye distances above the eye
    line ``eyes`` (in ``face01``'s pixels), holding pixels farther than ``OCCLUSION_DELTA_E[1]``
    above ``OCCLUSION_SEED`` and reaching below ``OCCLUSION_FRINGE`` between the eyes: a fringe
    and its tips go, with the skin between its strands; brows and glasses that do not touch it
    stay, and so does a hairline above ``OCCLUSION_FRINGE``. B's forehead then shows where A's
    fringe was. Softened over a few pixels; all ones when there is
    no skin to compare with."""
    (lx, ly), (rx, ry) = eyes
    span = float(np.hypot(rx - lx, ry - ly))
    keep = np.ones(face01.shape[:2], np.float32)
    if span < 2.0:
        return keep
    across = np.array([rx - lx, ry - ly]) / span
    up = np.array([across[1], -across[0]])  # perpendicular, pointing up the image
    ys, xs = np.mgrid[0 : face01.shape[0], 0 : face01.shape[1]].astype(np.float32)
    height = ((xs - (lx + rx) / 2) * up[0] + (ys - (ly + ry) / 2) * up[1]) / span
    along = ((xs - (lx + rx) / 2) * across[0] + (ys - (ly + ry) / 2) * across[1]) / span
    skin = region & (height < -0.2)
    if skin.sum() < 16:
        return keep
    lab = cv2.cvtColor(np.ascontiguousarray(face01, np.float32), cv2.COLOR_RGB2LAB)
    delta = np.linalg.norm(lab - np.median(lab[skin], axis=0), axis=2)
    weak, strong = OCCLUSION_DELTA_E
    candidate = ((delta > weak) & (height >= OCCLUSION_REACH)).astype(np.uint8)
    count, labels = cv2.connectedComponents(candidate, connectivity=8)
    lowest = np.full(count, np.inf)  # over the middle of the forehead (not the temples)
    middle = (candidate > 0) & (np.abs(along) < OCCLUSION_MIDDLE)
    np.minimum.at(lowest, labels[middle], height[middle])
    seeded = np.unique(labels[(delta > strong) & (height >= OCCLUSION_SEED)])
    fringe = seeded[(seeded > 0) & (lowest[seeded] < OCCLUSION_FRINGE)]
    hair = np.isin(labels, fringe).astype(np.uint8)
    # close the skin showing between strands and a fringe's tips (pasted alone they read as
    # streaks on B's forehead), then soften the edge
    radius = max(1, round(span * 0.08))
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * radius + 1,) * 2)
    hair = cv2.dilate(cv2.morphologyEx(hair, cv2.MORPH_CLOSE, kernel), kernel).astype(np.float32)
    hair = cv2.GaussianBlur(hair, (4 * radius + 1,) * 2, radius)
    return np.clip(1.0 - hair, 0.0, 1.0).astype(np.float32)
