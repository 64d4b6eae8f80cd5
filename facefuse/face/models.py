"""Where the face models come from: files inside installed PyPI packages, never a download.

* OpenCV Haar cascades (``frontalface_default``, ``eye``) from ``cv2.data.haarcascades``.
* dlib's HOG frontal detector, built into the ``dlib-bin`` wheel.
* dlib's MMOD CNN detector and 5-point landmark predictor, from ``face_recognition_models``
  (CC0). Its ``__init__`` needs ``pkg_resources``, so the folder is found with
  :func:`importlib.util.find_spec`, which does not execute the package.

Each loader builds its model once per thread and raises :class:`ModelLoadError` when the
package or file is missing. Per thread, not per process: dlib's detectors and OpenCV's cascades
must not be used by two threads at once (dlib's object_detector documents it), and
:func:`facefuse.face.fusion.prepare_fusion` detects the two faces on two threads. dlib is
optional: without it only the Haar stages work, which :func:`dlib_available` tells.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import cv2

from facefuse.core.errors import ModelLoadError

try:  # dlib is a dependency, but the Haar-only path must keep working without it
    import dlib
except ImportError:  # pragma: no cover - exercised only where dlib-bin is not installed
    dlib = None

_THREAD = threading.local()
T = TypeVar("T")
MMOD_FILE = "mmod_human_face_detector.dat"
LANDMARKS5_FILE = "shape_predictor_5_face_landmarks.dat"


def dlib_available() -> bool:
    """True when the dlib wheel is importable."""
    return dlib is not None


def _per_thread(loader: Callable[[], T]) -> Callable[[], T]:
    @functools.wraps(loader)
    def load() -> T:
        models = _THREAD.__dict__.setdefault("models", {})
        if loader.__name__ not in models:
            models[loader.__name__] = loader()
        return models[loader.__name__]

    return load


def _require_dlib():
    if dlib is None:
        raise ModelLoadError("dlib is not installed; pip install dlib-bin")
    return dlib


def model_file(name: str) -> Path:
    """Path of a model file shipped in the ``face_recognition_models`` package."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("face_recognition_models is not installed; it ships the dlib models")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / name
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from face_recognition_models")
    return path


def models_available() -> bool:
    """True when dlib and the MMOD + 5-point model files are all present."""
    if dlib is None:
        return False
    try:
        model_file(MMOD_FILE)
        model_file(LANDMARKS5_FILE)
    except ModelLoadError:
        return False
    return True


def _cascade(name: str) -> cv2.CascadeClassifier:
    path = Path(cv2.data.haarcascades) / name
    classifier = cv2.CascadeClassifier(str(path))
    if classifier.empty():
        raise ModelLoadError(f"OpenCV cascade {path} is missing or unreadable")
    return classifier


@_per_thread
def haar_face() -> cv2.CascadeClassifier:
    """OpenCV's frontal-face Haar cascade."""
    return _cascade("haarcascade_frontalface_default.xml")


@_per_thread
def haar_eye() -> cv2.CascadeClassifier:
    """OpenCV's eye Haar cascade."""
    return _cascade("haarcascade_eye.xml")


@_per_thread
def hog_detector():
    """dlib's HOG + linear SVM frontal face detector (no model file)."""
    return _require_dlib().get_frontal_face_detector()


@_per_thread
def mmod_detector():
    """dlib's MMOD CNN face detector (robust to pose, slow on CPU)."""
    return _require_dlib().cnn_face_detection_model_v1(str(model_file(MMOD_FILE)))


@_per_thread
def landmarks5():
    """dlib's 5-point predictor: two corners of each eye and the base of the nose."""
    return _require_dlib().shape_predictor(str(model_file(LANDMARKS5_FILE)))
