"""Mouth and eyelids that follow B in a stream: A's moved points set to B's own opening.

The expression model's modes carry a smile and a mouth opening, but a talking or blinking B
moves its lower lip and eyelids by amounts no mode reads exactly. In a stream
(``ExpressionEdit.follow_target``) the warp's points are corrected after retargeting:

* :func:`follow_lip_gap`: A's lower lip (inner and outer contour) and chin move along the face's
  down direction so that A's inner-lip parting, in outer-eye spans, equals B's; the upper lip
  stays (talking moves the jaw). The shift is full at the lips' middle and fades to none at the
  mouth corners.
* :func:`follow_eye_opening`: each upper eyelid moves towards (or away from) its lower lid so
  that the eye's opening over its width is A's own opening times B's opening over B's open
  eye (``open_ratio``, a stream's running maximum): a blink of B closes A's eyes, A's eye shape
  stays A's.

Both act on (468, 2) FaceMesh points and return new arrays; the mesh indices are MediaPipe's.
"""

from __future__ import annotations

import numpy as np

from facefuse.face import facemesh as fm

LOWER_LIP_INNER = (324, 318, 402, 317, 14, 87, 178, 88, 95)
LOWER_LIP_OUTER = (375, 321, 405, 314, 17, 84, 181, 91, 146)
CHIN = (18, 200, 199, 175, 152, 83, 313, 201, 421, 208, 428, 32, 262, 140, 369, 171, 396)
# (upper lid, lower lid, corners) of the image's left and right eye
EYES = (
    ((246, 161, 160, 159, 158, 157, 173), (7, 163, 144, 145, 153, 154, 155), (33, 133)),
    ((466, 388, 387, 386, 385, 384, 398), (249, 390, 373, 374, 380, 381, 382), (263, 362)),
)


def _frame(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    left, right = points[fm.EYE_OUTER[0]], points[fm.EYE_OUTER[1]]
    span = float(np.linalg.norm(right - left))
    along = (right - left) / max(span, 1e-9)
    return along, np.array([-along[1], along[0]]), span


def lip_gap(points: np.ndarray) -> float:
    """Inner-lip parting in outer-eye spans (as :func:`facefuse.face.expression.lip_gap`)."""
    _, down, span = _frame(points)
    upper, lower = points[fm.LIP_INNER_MID[0]], points[fm.LIP_INNER_MID[1]]
    return float((lower - upper) @ down / max(span, 1e-9))


def follow_lip_gap(points: np.ndarray, gap: float) -> np.ndarray:
    """``points`` with the lower lip and chin moved so that :func:`lip_gap` equals ``gap``
    (never below 0: lips do not pass through each other)."""
    p = np.array(points, np.float64)
    along, down, span = _frame(p)
    shift = (max(float(gap), 0.0) - max(lip_gap(p), 0.0)) * span
    if abs(shift) < 1e-6:
        return p
    left, right = p[fm.MOUTH_CORNERS[0]], p[fm.MOUTH_CORNERS[1]]
    centre, half = (left + right) / 2, max(float(np.linalg.norm(right - left)) / 2, 1e-6)

    def profile(idx):
        across = np.abs((p[idx] - centre) @ along) / half
        return np.clip(1.0 - across**2, 0.0, 1.0)

    # the lower lip's middle (point 14) moves by exactly ``shift``
    shift /= max(float(profile([fm.LIP_INNER_MID[1]])[0]), 0.2)
    for indices, share in ((LOWER_LIP_INNER, 1.0), (LOWER_LIP_OUTER, 1.0), (CHIN, 0.6)):
        idx = list(indices)
        weight = profile(idx) if share == 1.0 else share
        p[idx] += (shift * np.asarray(weight))[..., None] * down
    return p


def eye_opening(points: np.ndarray) -> np.ndarray:
    """(2,) each eye's lid distance (mean of upper-lower pairs) over its width."""
    p = np.asarray(points, np.float64)
    out = []
    for upper, lower, corners in EYES:
        width = float(np.linalg.norm(p[corners[0]] - p[corners[1]]))
        gap = np.linalg.norm(p[list(upper)] - p[list(lower)], axis=1).mean()
        out.append(gap / max(width, 1e-9))
    return np.array(out)


def follow_eye_opening(points: np.ndarray, open_ratio: np.ndarray) -> np.ndarray:
    """``points`` with each upper lid moved along its lid-to-lid line so that the eye's
    opening is its own times ``open_ratio`` (per eye, clipped to [0.05, 1.2])."""
    p = np.array(points, np.float64)
    ratios = np.clip(np.asarray(open_ratio, np.float64).reshape(2), 0.05, 1.2)
    for (upper, lower, _), ratio in zip(EYES, ratios):
        up, low = list(upper), list(lower)
        p[up] = p[low] + (p[up] - p[low]) * ratio
    return p
