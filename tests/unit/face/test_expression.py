"""The expression basis and the piecewise-affine warp, on scikit-image's astronaut."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.face import expression as ex
from facefuse.face import facemesh as fm
from facefuse.face.detect import find_face
from facefuse.face.warp import backward_map, piecewise_affine


@pytest.fixture(scope="module")
def astronaut_points(astronaut):
    return fm.face_mesh(astronaut, find_face(astronaut)).points


def test_shipped_basis_is_small_and_names_its_data():
    assert ex.BASIS_FILE.is_file() and ex.BASIS_FILE.stat().st_size < 200_000
    model = ex.default_model()
    assert model.template.shape == (fm.COUNT, 2)
    assert model.expression.shape == (len(ex.MODES), 2 * fm.COUNT)
    assert model.identity.shape == (ex.IDENTITY_MODES, 2 * fm.COUNT)
    assert "DeBruine" in model.meta["source"]
    # never fitted on a held-out person
    assert not set(model.meta["people"]) & set(model.meta["heldout_excluded"])
    assert len(model.meta["people"]) >= 60


def test_template_frame_has_unit_eye_span():
    model = ex.default_model()
    assert model.template[fm.EYE_OUTER[0], 0] < model.template[fm.EYE_OUTER[1], 0]
    span = np.linalg.norm(model.template[fm.EYE_OUTER[1]] - model.template[fm.EYE_OUTER[0]])
    assert span == pytest.approx(1.0, abs=0.05)


def test_smile_mode_widens_and_lifts_the_mouth_and_open_parts_the_lips():
    model = ex.default_model()
    t = model.template
    smile = t + model.expression[0].reshape(-1, 2)
    assert ex.mouth_width(smile) > ex.mouth_width(t) + 0.03
    assert ex.corner_rise(smile) > ex.corner_rise(t) + 0.02
    opened = t + model.expression[1].reshape(-1, 2)
    assert ex.lip_gap(opened) - ex.lip_gap(t) == pytest.approx(ex.OPEN_GAP, rel=1e-3)


def test_retarget_to_own_coefficients_is_the_identity(astronaut_points):
    model = ex.default_model()
    own = model.coefficients(astronaut_points)
    assert np.allclose(model.retarget(astronaut_points, own, own), astronaut_points, atol=1e-6)


def test_retarget_reaches_the_wanted_coefficients(astronaut_points):
    model = ex.default_model()
    own = model.coefficients(astronaut_points)
    wanted = own + np.array([1.0, 0.5, 0.0, 0.0])
    moved = model.retarget(astronaut_points, own, wanted)
    assert np.allclose(model.coefficients(moved), wanted, atol=0.2)  # renormalisation
    assert ex.mouth_width(moved) > ex.mouth_width(astronaut_points)
    assert ex.lip_gap(moved) > ex.lip_gap(astronaut_points) + 0.1
    # the eyes stay where they were (the rigid frame)
    eyes = list(fm.EYE_OUTER)
    assert np.abs(moved[eyes] - astronaut_points[eyes]).max() < 0.02 * 60


def test_warp_without_motion_is_the_identity(astronaut, astronaut_points):
    out = piecewise_affine(astronaut, astronaut_points, astronaut_points)
    assert np.abs(out.astype(int) - astronaut.astype(int)).max() <= 1


def test_warp_moves_a_point_and_leaves_the_border(astronaut):
    points = np.array([[200.0, 200.0], [300.0, 200.0], [250.0, 300.0], [250.0, 250.0]])
    moved = points.copy()
    moved[3] += (6.0, 4.0)
    map_x, map_y = backward_map(points, moved, astronaut.shape[:2])
    # the destination of the moved point samples its source
    assert map_x[254, 256] == pytest.approx(250.0, abs=0.01)
    assert map_y[254, 256] == pytest.approx(250.0, abs=0.01)
    out = piecewise_affine(astronaut, points, moved)
    assert np.array_equal(out[:20], astronaut[:20])


def test_mismatched_points_are_refused():
    with pytest.raises(ValueError, match="destination"):
        backward_map(np.zeros((3, 2)), np.zeros((4, 2)), (10, 10))
