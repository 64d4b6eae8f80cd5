"""Face detection on photos that ship with scikit-image and matplotlib, and on non-faces."""

import math

import cv2
import numpy as np
import pytest

from facefuse.core.errors import NoFaceFound
from facefuse.face import geometry, models
from facefuse.face.detect import Face, default_stages, detect_face, find_face, find_face_traced
from facefuse.face.imageio import PixelError
from facefuse.face.landmarks import from_haar_eyes, geometric

FAST = ("hog", "hog-rotated")


@pytest.fixture(scope="module")
def astronaut_face(astronaut):
    return detect_face(astronaut, "SOURCE_IMAGE")


def _inside(point, box) -> bool:
    x0, y0, x1, y1 = box
    return x0 <= point[0] < x1 and y0 <= point[1] < y1


def _check_plausible(face: Face, shape) -> None:
    x0, y0, x1, y1 = face.box
    assert 0 <= x0 < x1 <= shape[1] and 0 <= y0 < y1 <= shape[0]
    assert _inside(face.left_eye, face.box) and _inside(face.right_eye, face.box)
    assert face.left_eye[0] < face.right_eye[0]
    width = x1 - x0
    assert 0.25 * width < face.eye_distance < 0.65 * width
    # eyes in the upper part of the box, roughly level in these upright portraits
    assert face.eye_centre[1] < y0 + 0.6 * (y1 - y0)
    assert abs(face.left_eye[1] - face.right_eye[1]) < 0.2 * face.eye_distance


def test_default_chain_uses_the_shipped_models():
    assert models.models_available()
    assert default_stages() == ("hog", "hog-rotated", "mmod")


def test_astronaut_face(astronaut, astronaut_face):
    face = astronaut_face
    _check_plausible(face, astronaut.shape)
    assert face.detector == "hog" and face.angle == 0.0 and face.score > 0
    assert face.eyes_from == "landmarks5" and len(face.landmarks) == 5
    # Eileen Collins' eyes are near (204, 102) and (246, 104) in skimage's astronaut
    assert math.dist(face.left_eye, (204, 102)) < 6
    assert math.dist(face.right_eye, (246, 104)) < 6
    assert _inside(face.nose, face.box) and face.nose[1] > face.eye_centre[1]


def test_grace_hopper_face(grace):
    face = detect_face(grace, "TARGET_IMAGE")
    _check_plausible(face, grace.shape)
    assert 60 < face.eye_distance < 130  # a head-and-shoulders portrait 512 px wide
    assert 180 < face.eye_centre[0] < 340 and 150 < face.eye_centre[1] < 260


def test_haar_chain_finds_the_same_face(grace):
    hog_face = detect_face(grace, "TARGET_IMAGE", ("hog",))
    haar_face = detect_face(grace, "TARGET_IMAGE", ("haar",))
    assert haar_face.detector == "haar"
    assert math.dist(haar_face.eye_centre, hog_face.eye_centre) < 0.15 * hog_face.eye_distance


def test_rotation_search_maps_eyes_back_to_the_input(astronaut, astronaut_face):
    angle = 25.0
    height, width = astronaut.shape[:2]
    rotation = cv2.getRotationMatrix2D((width / 2, height / 2), angle, 1.0)
    tilted = cv2.warpAffine(astronaut, rotation, (width, height), borderMode=cv2.BORDER_REFLECT)
    face, runs = find_face_traced(tilted, ("hog-rotated",))
    assert face is not None and face.detector.startswith("hog") and face.angle != 0
    assert [r.name for r in runs] == ["hog-rotated"] and runs[0].found
    expected = geometry.apply(rotation, [astronaut_face.left_eye, astronaut_face.right_eye])
    tolerance = 0.2 * astronaut_face.eye_distance
    assert math.dist(face.left_eye, expected[0]) < tolerance
    assert math.dist(face.right_eye, expected[1]) < tolerance


def test_mmod_stage_on_a_small_crop(astronaut, astronaut_face):
    crop = np.ascontiguousarray(astronaut[50:250, 130:330])  # 200 px, the face ~90 px wide
    face = detect_face(crop, "SOURCE_IMAGE", ("mmod",))
    assert face.detector == "mmod" and face.eyes_from == "landmarks5"
    expected = (astronaut_face.left_eye[0] - 130, astronaut_face.left_eye[1] - 50)
    assert math.dist(face.left_eye, expected) < 0.2 * astronaut_face.eye_distance


@pytest.mark.parametrize("kind", ["flat", "noise"])
def test_no_face_raises_naming_the_field(kind):
    rng = np.random.default_rng(0)
    if kind == "flat":
        image = np.full((96, 128, 3), 200, dtype=np.uint8)
    else:
        image = rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8)
    assert find_face(image) is None
    with pytest.raises(NoFaceFound) as info:
        detect_face(image, "TARGET_IMAGE")
    assert info.value.field == "TARGET_IMAGE"
    assert "no face" in str(info.value)


def test_traced_stages_run_in_order_until_one_finds_a_face():
    flat = np.full((96, 96, 3), 90, dtype=np.uint8)
    face, runs = find_face_traced(flat, ("haar", "hog"))
    assert face is None
    assert [(r.name, r.found) for r in runs] == [("haar", False), ("hog", False)]
    assert all(r.seconds >= 0 for r in runs)


def test_bad_inputs_are_refused(astronaut):
    with pytest.raises(PixelError):
        find_face(astronaut.astype(np.float32))
    with pytest.raises(PixelError):
        find_face(astronaut[:, :, 0])
    with pytest.raises(ValueError, match="unknown detector stage"):
        find_face(astronaut, ("retinaface",))


def test_eye_fallbacks(astronaut, astronaut_face):
    gray = cv2.cvtColor(astronaut, cv2.COLOR_RGB2GRAY)
    box = astronaut_face.box
    haar = from_haar_eyes(gray, box)
    assert haar is not None and haar.source == "haar-eyes"
    tolerance = 0.2 * astronaut_face.eye_distance
    assert math.dist(haar.left, astronaut_face.left_eye) < tolerance
    assert math.dist(haar.right, astronaut_face.right_eye) < tolerance
    estimate = geometric(box, "hog")
    assert estimate.source == "geometric"
    assert math.dist(estimate.left, astronaut_face.left_eye) < 0.35 * astronaut_face.eye_distance
    assert math.dist(estimate.right, astronaut_face.right_eye) < 0.35 * astronaut_face.eye_distance
    blank = np.full_like(gray, 128)
    assert from_haar_eyes(blank, box) is None
