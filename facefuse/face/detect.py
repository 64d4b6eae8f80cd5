"""Find the main (largest) face in an RGB image with a cascade of detector stages.

Stages run in order and the first one that finds a face wins, so the fast detector pays for
most photos and the robust one only for the hard ones:

* ``"hog"``: dlib HOG, on a copy scaled to at most ``DETECT_SIDE`` pixels (~20 ms at 500 px).
* ``"hog-rotated"``: the same after rotating by +-15 then +-30 degrees (tilted heads).
* ``"mmod"``: dlib's MMOD CNN on a copy of at most ``MMOD_SIDE`` pixels (~1 s, pose-robust).
* ``"haar"`` / ``"haar-rotated"``: OpenCV Haar cascades, the chain used when dlib is absent.

:func:`find_faces` with ``small=True`` (``FACE_SELECT all``) runs HOG upsampled twice on a copy
of at most ``SMALL_SIDE`` pixels, as ``dlib.get_frontal_face_detector()(image, 1)`` does: faces
from about 40 px (80 px otherwise, HOG's window) in images up to that side, ~4x HOG's cost;
hits scoring under ``SMALL_MIN_SCORE`` are dropped (upsampling also finds badges).

Invariants of a :class:`Face`: coordinates are in the input image's pixels, ``box`` is
(x0, y0, x1, y1) with exclusive x1/y1, clipped to the image and non-empty; ``left_eye`` is
the eye on the image's left; ``landmarks`` is dlib's 5-point order or None.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from facefuse.core.errors import ModelLoadError, NoFaceFound
from facefuse.face import models
from facefuse.face.imageio import PixelError
from facefuse.face.landmarks import locate_eyes

DETECT_SIDE = 640
SMALL_SIDE = 960
# upsampled HOG's hits under this score were badges and collars in our images (0.005-0.065);
# real faces, small ones included, scored 0.18-1.4
SMALL_MIN_SCORE = 0.1
MMOD_SIDE = 384
ROTATIONS = (15.0, -15.0, 30.0, -30.0)
STAGE_NAMES = ("hog", "hog-rotated", "mmod", "haar", "haar-rotated")


@dataclass(frozen=True)
class Face:
    """One detected face; see the module docstring for the coordinate invariants."""

    box: tuple[int, int, int, int]
    left_eye: tuple[float, float]
    right_eye: tuple[float, float]
    nose: tuple[float, float] | None
    landmarks: tuple[tuple[float, float], ...] | None
    detector: str
    score: float
    angle: float  # rotation (degrees) of the frame in which the detector found the face
    eyes_from: str  # "landmarks5", "haar-eyes" or "geometric"

    @property
    def eye_distance(self) -> float:
        return math.dist(self.left_eye, self.right_eye)

    @property
    def eye_centre(self) -> tuple[float, float]:
        return (
            (self.left_eye[0] + self.right_eye[0]) / 2,
            (self.left_eye[1] + self.right_eye[1]) / 2,
        )

    def alignment_points(self) -> np.ndarray:
        """Points for alignment, (k, 2) float64: left eye, right eye, and the nose if measured."""
        points = [self.left_eye, self.right_eye]
        if self.eyes_from == "landmarks5" and self.nose is not None:
            points.append(self.nose)
        return np.asarray(points, dtype=np.float64)


@dataclass(frozen=True)
class StageRun:
    """What one stage cost on one image, for :mod:`facefuse.face.evaluate`."""

    name: str
    seconds: float
    found: bool


@dataclass
class _Frame:
    """An image the detectors look at, and the affine map from its pixels to the input's."""

    gray: np.ndarray
    rgb: np.ndarray
    to_image: np.ndarray  # 3x3, frame pixel -> input image pixel
    angle: float = 0.0

    def map(self, points: np.ndarray) -> np.ndarray:
        points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        return points @ self.to_image[:2, :2].T + self.to_image[:2, 2]


def default_stages() -> tuple[str, ...]:
    """The best chain the installed packages allow."""
    if models.models_available():
        return ("hog", "hog-rotated", "mmod")
    if models.dlib_available():
        return ("hog", "hog-rotated", "haar", "haar-rotated")
    return ("haar", "haar-rotated")


def _scaled(rgb: np.ndarray, max_side: int) -> _Frame:
    height, width = rgb.shape[:2]
    scale = min(1.0, max_side / max(height, width))
    if scale < 1.0:
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        rgb = cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)
        scale_x, scale_y = width / size[0], height / size[1]
    else:
        scale_x = scale_y = 1.0
    to_image = np.array([[scale_x, 0, 0], [0, scale_y, 0], [0, 0, 1]], dtype=np.float64)
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    return _Frame(gray, rgb, to_image)


def _rotated(frame: _Frame, angle: float) -> _Frame:
    """``frame`` rotated by ``angle`` degrees (counter-clockwise) on an enlarged canvas."""
    height, width = frame.gray.shape
    rotation = cv2.getRotationMatrix2D((width / 2, height / 2), angle, 1.0)
    cos, sin = abs(rotation[0, 0]), abs(rotation[0, 1])
    new_w, new_h = (
        math.ceil(width * cos + height * sin),
        math.ceil(width * sin + height * cos),
    )
    rotation[0, 2] += (new_w - width) / 2
    rotation[1, 2] += (new_h - height) / 2
    forward = np.vstack([rotation, [0, 0, 1]])
    rgb = cv2.warpAffine(frame.rgb, rotation, (new_w, new_h), borderMode=cv2.BORDER_REPLICATE)
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    return _Frame(gray, rgb, frame.to_image @ np.linalg.inv(forward), angle)


Rect = tuple[float, float, float, float]


def _hog(frame: _Frame, upsample: int = 0) -> list[tuple[Rect, float]]:
    rects, scores, _ = models.hog_detector().run(frame.gray, upsample, 0.0)
    return [
        ((r.left(), r.top(), r.right() + 1, r.bottom() + 1), float(s))
        for r, s in zip(rects, scores, strict=True)
    ]


def _hog_small(frame: _Frame) -> list[tuple[Rect, float]]:
    return [hit for hit in _hog(frame, upsample=1) if hit[1] >= SMALL_MIN_SCORE]


def _haar(frame: _Frame) -> list[tuple[Rect, float]]:
    min_side = max(24, min(frame.gray.shape) // 10)
    boxes, neighbours = models.haar_face().detectMultiScale2(
        frame.gray, scaleFactor=1.1, minNeighbors=5, minSize=(min_side, min_side)
    )
    return [
        ((x, y, x + w, y + h), float(n)) for (x, y, w, h), n in zip(boxes, neighbours, strict=True)
    ]


def _mmod(frame: _Frame) -> list[tuple[Rect, float]]:
    """MMOD on a smaller copy; rects are returned in ``frame``'s pixels."""
    small = _scaled(frame.rgb, MMOD_SIDE)
    sx, sy = small.to_image[0, 0], small.to_image[1, 1]
    found = models.mmod_detector()(small.rgb, 0)
    return [
        (
            (
                d.rect.left() * sx,
                d.rect.top() * sy,
                (d.rect.right() + 1) * sx,
                (d.rect.bottom() + 1) * sy,
            ),
            float(d.confidence),
        )
        for d in found
    ]


_DETECTORS = {"hog": _hog, "haar": _haar, "mmod": _mmod}


def _run_stage(name: str, base: _Frame) -> tuple[_Frame, Rect, float] | None:
    """Largest hit of one stage as (frame, rect in frame pixels, score), or None."""
    detector_name, rotated = name.removesuffix("-rotated"), name.endswith("-rotated")
    detector = _DETECTORS[detector_name]
    for frame in (_rotated(base, a) for a in ROTATIONS) if rotated else (base,):
        hits = detector(frame)
        if hits:
            rect, score = max(hits, key=lambda h: (h[0][2] - h[0][0]) * (h[0][3] - h[0][1]))
            return frame, rect, score
    return None


def _to_face(
    image_shape: tuple[int, ...], frame: _Frame, rect: Rect, score: float, name: str
) -> Face:
    eyes = locate_eyes(frame.gray, rect, name)
    x0, y0, x1, y1 = rect
    centre = frame.map(np.array([(x0 + x1) / 2, (y0 + y1) / 2]))[0]
    scale = math.sqrt(abs(np.linalg.det(frame.to_image[:2, :2])))
    half_w = (x1 - x0) * scale / 2
    half_h = (y1 - y0) * scale / 2
    height, width = image_shape[:2]
    box = (
        int(np.clip(math.floor(centre[0] - half_w), 0, width - 1)),
        int(np.clip(math.floor(centre[1] - half_h), 0, height - 1)),
        int(np.clip(math.ceil(centre[0] + half_w), 1, width)),
        int(np.clip(math.ceil(centre[1] + half_h), 1, height)),
    )
    box = (box[0], box[1], max(box[2], box[0] + 1), max(box[3], box[1] + 1))

    def mapped(point: tuple[float, float]) -> tuple[float, float]:
        x, y = frame.map(np.asarray(point))[0]
        return (float(x), float(y))

    points = tuple(mapped(p) for p in eyes.points5) if eyes.points5 else None
    return Face(
        box=box,
        left_eye=mapped(eyes.left),
        right_eye=mapped(eyes.right),
        nose=mapped(eyes.nose) if eyes.nose is not None else None,
        landmarks=points,
        detector=name if frame.angle == 0 else f"{name}{frame.angle:+.0f}",
        score=score,
        angle=frame.angle,
        eyes_from=eyes.source,
    )


def _check_rgb(rgb: np.ndarray) -> np.ndarray:
    array = np.asarray(rgb)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise PixelError(
            f"face detection needs RGB uint8 (H, W, 3), got {array.dtype} {array.shape}"
        )
    return np.ascontiguousarray(array)


def find_face_traced(
    rgb: np.ndarray, stages: Sequence[str] | None = None
) -> tuple[Face | None, list[StageRun]]:
    """The main face (or None) and the cost of every stage that ran."""
    rgb = _check_rgb(rgb)
    stages = tuple(stages) if stages is not None else default_stages()
    unknown = [s for s in stages if s not in STAGE_NAMES]
    if unknown:
        raise ValueError(f"unknown detector stage(s) {unknown}; choose from {STAGE_NAMES}")
    base = _scaled(rgb, DETECT_SIDE)
    runs: list[StageRun] = []
    for name in stages:
        started = time.perf_counter()
        hit = _run_stage(name, base)
        face = _to_face(rgb.shape, *hit, name.removesuffix("-rotated")) if hit else None
        runs.append(StageRun(name, time.perf_counter() - started, face is not None))
        if face is not None:
            return face, runs
    return None, runs


def find_faces(
    rgb: np.ndarray, stages: Sequence[str] | None = None, small: bool = False
) -> list[Face]:
    """Every face that the first stage with a hit finds in its first frame with a hit, largest
    first ([] when no stage finds one); the first is :func:`find_face`'s main face.
    ``small``: HOG also finds faces from ~40 px (module docstring)."""
    rgb = _check_rgb(rgb)
    stages = tuple(stages) if stages is not None else default_stages()
    base = _scaled(rgb, DETECT_SIDE)
    for name in stages:
        detector_name, rotated = name.removesuffix("-rotated"), name.endswith("-rotated")
        detector = _DETECTORS[detector_name]
        if small and name == "hog":
            frames = (_scaled(rgb, SMALL_SIDE),)
            detector = _hog_small
        else:
            frames = (_rotated(base, a) for a in ROTATIONS) if rotated else (base,)
        for frame in frames:
            hits = detector(frame)
            if hits:
                hits.sort(key=lambda h: (h[0][2] - h[0][0]) * (h[0][3] - h[0][1]), reverse=True)
                return [_to_face(rgb.shape, frame, rect, score, detector_name)
                        for rect, score in hits]  # fmt: skip
    return []


def warm_up(stages: Sequence[str] | None = None) -> None:
    """Load every model the chain uses in the calling thread (models are per thread; dlib's
    HOG alone takes seconds to build). :func:`facefuse.face.fusion.warm_up` does it in the
    threads that :func:`~facefuse.face.fusion.prepare_fusion` detects on."""
    for name in tuple(stages) if stages is not None else default_stages():
        {"hog": models.hog_detector, "mmod": models.mmod_detector, "haar": models.haar_face}[
            name.removesuffix("-rotated")
        ]()
    if models.dlib_available():
        with contextlib.suppress(ModelLoadError):  # eyes then come from the Haar cascade
            models.landmarks5()
    models.haar_eye()


def find_face(rgb: np.ndarray, stages: Sequence[str] | None = None) -> Face | None:
    """The main (largest) face, or None when no stage finds one."""
    return find_face_traced(rgb, stages)[0]


def detect_face(rgb: np.ndarray, field: str, stages: Sequence[str] | None = None) -> Face:
    """The main face, or :class:`NoFaceFound` naming ``field`` (e.g. ``SOURCE_IMAGE``)."""
    face = find_face(rgb, stages)
    if face is None:
        raise NoFaceFound(field)
    return face
