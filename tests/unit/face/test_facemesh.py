"""FaceMesh on photos that ship inside scikit-image (no ../shared)."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.face import facemesh
from facefuse.face.detect import find_face


@pytest.fixture(scope="module")
def astronaut_mesh(astronaut):
    face = find_face(astronaut)
    assert face is not None
    return face, facemesh.face_mesh(astronaut, face)


def test_model_file_ships_and_has_the_converted_signature():
    assert facemesh.MODEL_FILE.is_file()
    sess = facemesh.session()
    (inp,) = sess.get_inputs()
    assert inp.shape == [1, 192, 192, 3]
    assert [o.name for o in sess.get_outputs()] == ["landmarks", "presence"]


def test_points_sit_on_the_detected_face(astronaut_mesh):
    face, mesh = astronaut_mesh
    assert mesh.points.shape == (facemesh.COUNT, 2)
    assert mesh.depth.shape == (facemesh.COUNT,)
    assert mesh.presence > 0.9
    # the outer eye corners lie beside the detector's eye centres, the left one on the left
    left, right = mesh.points[list(facemesh.EYE_OUTER)]
    assert left[0] < face.left_eye[0] < face.right_eye[0] < right[0]
    span = mesh.eye_span
    assert 1.2 * face.eye_distance < span < 2.2 * face.eye_distance
    for corner, eye in ((left, face.left_eye), (right, face.right_eye)):
        assert np.linalg.norm(corner - np.asarray(eye)) < 0.6 * face.eye_distance
    # nose below the eyes, mouth below the nose, mouth corners either side of the nose
    eye_y = (left[1] + right[1]) / 2
    nose = mesh.points[facemesh.NOSE_TIP]
    mouth_left, mouth_right = mesh.points[list(facemesh.MOUTH_CORNERS)]
    assert eye_y < nose[1] < min(mouth_left[1], mouth_right[1])
    assert mouth_left[0] < nose[0] < mouth_right[0]
    # upper lip above the lower one
    upper, lower = mesh.points[list(facemesh.LIP_OUTER_MID)]
    assert upper[1] < lower[1]


def test_refined_pass_agrees_with_the_first(astronaut, astronaut_mesh):
    face, mesh = astronaut_mesh
    first = facemesh.face_mesh(astronaut, face, refine=False)
    # the second crop is cut from the first answer: the two agree within a few percent of the
    # eye span (a bad first crop would move points by tens of percent)
    assert np.median(np.linalg.norm(first.points - mesh.points, axis=1)) < 0.05 * mesh.eye_span


def test_points_follow_a_rotated_and_shifted_photo(astronaut, astronaut_mesh):
    face, mesh = astronaut_mesh
    import cv2

    matrix = cv2.getRotationMatrix2D((256.0, 256.0), 20.0, 1.0)
    matrix[:, 2] += (12.0, -7.0)
    turned = cv2.warpAffine(astronaut, matrix, (512, 512), borderMode=cv2.BORDER_REPLICATE)
    eyes = np.asarray([face.left_eye, face.right_eye]) @ matrix[:, :2].T + matrix[:, 2]
    moved = facemesh.mesh_from_eyes(turned, tuple(eyes[0]), tuple(eyes[1]))
    expected = mesh.points @ matrix[:, :2].T + matrix[:, 2]
    error = np.median(np.linalg.norm(moved.points - expected, axis=1))
    assert error < 0.04 * mesh.eye_span


def test_coincident_eyes_are_refused(astronaut):
    with pytest.raises(ValueError, match="coincide"):
        facemesh.mesh_from_eyes(astronaut, (10.0, 10.0), (10.2, 10.0))
