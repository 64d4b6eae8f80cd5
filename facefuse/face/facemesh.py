"""MediaPipe FaceMesh: 468 face landmarks from an ONNX graph that ships in this package.

``data/face_landmark.onnx`` is MediaPipe's ``face_landmark.tflite`` (mediapipe 0.10.14 wheel,
Apache-2.0, THIRD_PARTY_LICENSES.md) converted by :mod:`facefuse.face.facemesh_convert`; it
runs on ONNX Runtime, no mediapipe wheel. The network sees a 192 x 192 RGB crop in [0, 1]
around an upright face and returns 468 (x, y, z) points in that crop's pixels plus a presence
logit. :func:`face_mesh` cuts that crop from a detected :class:`~facefuse.face.detect.Face`
(eyes level, centred below the eyes, side :data:`ROI_SIDE` eye distances), runs the graph,
then cuts the crop again from the first answer's own points (MediaPipe's tracking ROI: the
points' box, eyes level, 1.5x) and runs it once more; points come back in the image's pixels.

Indices used elsewhere (MediaPipe's canonical mesh; "left" is the image's left):
eye outer corners 33 (left) / 263 (right), inner corners 133 / 362, nose tip 1, mouth corners
61 (left) / 291 (right), lips' middle: outer 0 (upper) / 17 (lower), inner 13 / 14.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from facefuse.core.errors import ModelLoadError

MODEL_FILE = Path(__file__).parent / "data" / "face_landmark.onnx"
INPUT_SIDE = 192
ROI_SIDE = 3.3  # first crop's side, in eye distances (about MediaPipe's 1.5x face box)
ROI_DOWN = 0.45  # first crop's centre below the eye midpoint, in eye distances
TRACK_SCALE = 1.5  # second crop: the first answer's box times this (MediaPipe's tracking ROI)

EYE_OUTER = (33, 263)
EYE_INNER = (133, 362)
NOSE_TIP = 1
MOUTH_CORNERS = (61, 291)
LIP_OUTER_MID = (0, 17)
LIP_INNER_MID = (13, 14)
LIPS_OUTER = (61, 185, 40, 39, 37, 0, 267, 269, 270, 409, 291,
              375, 321, 405, 314, 17, 84, 181, 91, 146)  # fmt: skip
LIPS_INNER = (78, 191, 80, 81, 82, 13, 312, 311, 310, 415, 308,
              324, 318, 402, 317, 14, 87, 178, 88, 95)  # fmt: skip
FACE_OVAL = (10, 338, 297, 332, 284, 251, 389, 356, 454, 323, 361, 288, 397, 365, 379, 378,
             400, 377, 152, 148, 176, 149, 150, 136, 172, 58, 132, 93, 234, 127, 162, 21, 54,
             103, 67, 109)  # fmt: skip
COUNT = 468


@dataclass(frozen=True)
class Mesh:
    """468 points in image pixels: ``points`` (468, 2) float64, ``depth`` (468,) in the same
    pixel scale (smaller is nearer the camera), ``presence`` the face probability of the
    network (sigmoid of its logit)."""

    points: np.ndarray
    depth: np.ndarray
    presence: float

    @property
    def eye_span(self) -> float:
        """Distance between the outer eye corners (the scale of every expression measure)."""
        return float(np.linalg.norm(self.points[EYE_OUTER[1]] - self.points[EYE_OUTER[0]]))


@functools.lru_cache(maxsize=1)
def session():
    """The ONNX Runtime session (one per process; ``run`` is thread-safe)."""
    import onnxruntime as ort

    if not MODEL_FILE.is_file():
        raise ModelLoadError(f"{MODEL_FILE} is missing (facefuse/face/data ships it)")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(MODEL_FILE), options, providers=["CPUExecutionProvider"])


def _roi_matrix(centre: np.ndarray, side: float, angle: float) -> np.ndarray:
    """2x3 image -> crop pixels for a square of ``side`` at ``centre`` turned by ``angle``
    (radians, the eye line's direction), so that the eye line is level in the crop."""
    scale = INPUT_SIDE / side
    cos, sin = math.cos(angle) * scale, math.sin(angle) * scale
    rotation = np.array([[cos, sin], [-sin, cos]])
    offset = INPUT_SIDE / 2 - rotation @ centre
    return np.hstack([rotation, offset[:, None]])


def _run(rgb: np.ndarray, matrix: np.ndarray) -> tuple[np.ndarray, float]:
    crop = cv2.warpAffine(
        rgb, matrix, (INPUT_SIDE, INPUT_SIDE), flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
    )  # fmt: skip
    x = (crop.astype(np.float32) / 255.0)[None]
    landmarks, presence = session().run(None, {"input_1": x})
    return landmarks.reshape(COUNT, 3).astype(np.float64), float(presence.reshape(-1)[0])


def _to_image(matrix: np.ndarray, crop_points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    inverse = cv2.invertAffineTransform(matrix)
    xy = crop_points[:, :2] @ inverse[:, :2].T + inverse[:, 2]
    scale = math.sqrt(abs(np.linalg.det(inverse[:, :2])))
    return xy, crop_points[:, 2] * scale


def mesh_from_eyes(
    rgb: np.ndarray,
    left_eye: tuple[float, float],
    right_eye: tuple[float, float],
    refine: bool = True,
) -> Mesh:
    """The mesh of the face whose eye centres are given (image pixels, ``left_eye`` on the
    image's left). ``refine`` runs the second, tracking-ROI pass (see the module docstring)."""
    rgb = np.ascontiguousarray(rgb)
    left, right = np.asarray(left_eye, np.float64), np.asarray(right_eye, np.float64)
    distance = float(np.linalg.norm(right - left))
    if distance < 1.0:
        raise ValueError("mesh_from_eyes: the eyes coincide")
    angle = math.atan2(right[1] - left[1], right[0] - left[0])
    down = np.array([-math.sin(angle), math.cos(angle)])
    centre = (left + right) / 2 + ROI_DOWN * distance * down
    matrix = _roi_matrix(centre, ROI_SIDE * distance, angle)
    crop_points, logit = _run(rgb, matrix)
    points, depth = _to_image(matrix, crop_points)
    if refine:
        matrix = _tracking_roi(points)
        crop_points, logit = _run(rgb, matrix)
        points, depth = _to_image(matrix, crop_points)
    return Mesh(points, depth, 1.0 / (1.0 + math.exp(-logit)))


def _tracking_roi(points: np.ndarray) -> np.ndarray:
    """MediaPipe's ROI from landmarks: the points' box in the eye-level frame, times 1.5."""
    left, right = points[EYE_OUTER[0]], points[EYE_OUTER[1]]
    angle = math.atan2(right[1] - left[1], right[0] - left[0])
    cos, sin = math.cos(angle), math.sin(angle)
    level = points @ np.array([[cos, -sin], [sin, cos]])  # rotate by -angle
    low, high = level.min(axis=0), level.max(axis=0)
    centre_level = (low + high) / 2
    centre = np.array([[cos, -sin], [sin, cos]]) @ centre_level
    side = float(max(high - low)) * TRACK_SCALE
    return _roi_matrix(centre, side, angle)


def track_mesh(rgb: np.ndarray, previous: np.ndarray) -> Mesh:
    """The mesh of the face whose points in the previous frame were ``previous`` (468, 2):
    one pass on their tracking ROI, as MediaPipe tracks a face across video frames. A low
    ``presence`` says the face is no longer there."""
    matrix = _tracking_roi(np.asarray(previous, np.float64))
    crop_points, logit = _run(np.ascontiguousarray(rgb), matrix)
    points, depth = _to_image(matrix, crop_points)
    return Mesh(points, depth, 1.0 / (1.0 + math.exp(-min(max(logit, -60.0), 60.0))))


def face_mesh(rgb: np.ndarray, face, refine: bool = True) -> Mesh:
    """The mesh of a detected :class:`~facefuse.face.detect.Face` (its eye centres)."""
    return mesh_from_eyes(rgb, face.left_eye, face.right_eye, refine)


def draw(rgb: np.ndarray, mesh: Mesh, radius: int = 1) -> np.ndarray:
    """A copy of ``rgb`` with the points drawn (green; eye corners, nose tip and mouth corners
    red), for looking at."""
    out = np.ascontiguousarray(rgb).copy()
    for x, y in mesh.points:
        cv2.circle(out, (round(x), round(y)), radius, (0, 255, 0), -1)
    for index in (*EYE_OUTER, *EYE_INNER, NOSE_TIP, *MOUTH_CORNERS, *LIP_INNER_MID):
        x, y = mesh.points[index]
        cv2.circle(out, (round(x), round(y)), radius + 2, (255, 0, 0), -1)
    return out
