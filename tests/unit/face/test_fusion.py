"""prepare_fusion / paste_back / FusionPlan, and the geometry, mask and colour helpers."""

import math

import cv2
import numpy as np
import pytest

from facefuse.core.errors import NoFaceFound
from facefuse.face import geometry
from facefuse.face.color import match_color
from facefuse.face.detect import detect_face
from facefuse.face.fusion import FusionPlan, paste_back, prepare_fusion
from facefuse.face.imageio import PixelError
from facefuse.face.mask import feathered_ellipse

SIZE = 256


@pytest.fixture(scope="module")
def plan(astronaut, grace):
    """Astronaut's face (A) onto Grace Hopper (B)."""
    return prepare_fusion(astronaut, grace, SIZE)


def _target_in_crop(plan, points):
    return geometry.apply(geometry.box_to_square(plan.crop_box, plan.size), points)


def test_plan_shapes_types_and_ranges(plan, grace):
    assert plan.composite.shape == (SIZE, SIZE, 3) and plan.composite.dtype == np.float32
    assert plan.mask.shape == (SIZE, SIZE) and plan.mask.dtype == np.float32
    assert 0.0 <= plan.composite.min() and plan.composite.max() <= 1.0
    assert 0.0 <= plan.mask.min() and plan.mask.max() <= 1.0
    x0, y0, x1, y1 = plan.crop_box
    assert x1 - x0 == y1 - y0  # square
    assert 0 <= x0 and 0 <= y0 and x1 <= grace.shape[1] and y1 <= grace.shape[0]
    fx0, fy0, fx1, fy1 = plan.target_face.box
    assert x0 <= fx0 and y0 <= fy0 and fx1 <= x1 and fy1 <= y1  # face plus margin
    assert plan.source_face.detector and plan.target_face.detector


def test_alignment_puts_source_eyes_on_target_eyes(plan):
    source = geometry.apply(plan.source_to_crop, plan.source_face.alignment_points())
    target = _target_in_crop(plan, plan.target_face.alignment_points())
    eye_distance = math.dist(target[0], target[1])
    for got, want in zip(source[:2], target[:2], strict=True):
        assert math.dist(got, want) < 0.05 * eye_distance


def test_warped_source_face_is_detected_at_the_target_eyes(plan, astronaut):
    warped = cv2.warpAffine(astronaut, plan.source_to_crop, (SIZE, SIZE), flags=cv2.INTER_LINEAR)
    face = detect_face(warped, "SOURCE_IMAGE", ("hog", "hog-rotated"))
    target = _target_in_crop(plan, [plan.target_face.left_eye, plan.target_face.right_eye])
    tolerance = 0.15 * math.dist(target[0], target[1])
    assert math.dist(face.left_eye, target[0]) < tolerance
    assert math.dist(face.right_eye, target[1]) < tolerance


def test_mask_is_one_at_the_face_and_zero_outside(plan):
    ellipse = geometry.face_ellipse(plan.target_face.left_eye, plan.target_face.right_eye)
    crop_ellipse = ellipse.mapped(geometry.box_to_square(plan.crop_box, SIZE))
    cx, cy = crop_ellipse.centre
    assert plan.mask[round(cy), round(cx)] == 1.0
    eyes = _target_in_crop(plan, [plan.target_face.left_eye, plan.target_face.right_eye])
    for x, y in eyes:
        assert plan.mask[round(y), round(x)] > 0.9
    for corner in (plan.mask[0, 0], plan.mask[0, -1], plan.mask[-1, 0], plan.mask[-1, -1]):
        assert corner == 0.0
    # 1.3 semi-axes from the centre along the longer axis, both ways: outside the face
    angle = math.radians(crop_ellipse.angle + 90)
    reach = 1.3 * crop_ellipse.axes[1]
    for sign in (-1, 1):
        x, y = cx + sign * reach * math.cos(angle), cy + sign * reach * math.sin(angle)
        if 0 <= x < SIZE and 0 <= y < SIZE:
            assert plan.mask[int(y), int(x)] == 0.0
    assert 0.1 < (plan.mask > 0.5).mean() < 0.6


def test_composite_is_the_target_crop_outside_the_mask(plan, grace):
    x0, y0, x1, y1 = plan.crop_box
    crop = cv2.resize(grace[y0:y1, x0:x1], (SIZE, SIZE), interpolation=cv2.INTER_AREA) / 255.0
    outside = plan.mask == 0
    assert outside.any()
    assert np.abs(plan.composite[outside] - crop[outside]).mean() < 0.02
    inside = plan.mask == 1
    assert np.abs(plan.composite[inside] - crop[inside]).mean() > 0.03  # A's face is there


def test_paste_back_changes_only_masked_pixels(plan, grace):
    rng = np.random.default_rng(1)
    generated = rng.random((SIZE, SIZE, 3), dtype=np.float32)
    result = paste_back(grace, generated, plan)
    assert result.shape == grace.shape and result.dtype == np.uint8
    changed_y, changed_x = np.nonzero((result != grace).any(axis=2))
    assert len(changed_x) > 1000
    x0, y0, x1, y1 = plan.crop_box
    assert changed_x.min() >= x0 and changed_x.max() < x1
    assert changed_y.min() >= y0 and changed_y.max() < y1
    # every changed pixel lies where the mask (one pixel of slack for interpolation) is > 0
    scale = SIZE / (x1 - x0)
    u = np.clip(((changed_x - x0 + 0.5) * scale - 0.5).round().astype(int), 0, SIZE - 1)
    v = np.clip(((changed_y - y0 + 0.5) * scale - 0.5).round().astype(int), 0, SIZE - 1)
    support = cv2.dilate((plan.mask > 0).astype(np.uint8), np.ones((3, 3), np.uint8))
    assert support[v, u].all()
    # inside the face the generated pixels replace B's
    nx, ny = (round(c) for c in plan.target_face.nose)
    face = (slice(ny - 5, ny + 5), slice(nx - 5, nx + 5))
    assert (result[face] != grace[face]).any(axis=2).mean() > 0.9


def test_paste_back_of_the_composite_keeps_the_rest_of_the_image(plan, grace):
    result = paste_back(grace, plan.composite, plan)
    x0, y0, x1, y1 = plan.crop_box
    untouched = np.ones(grace.shape[:2], bool)
    untouched[y0:y1, x0:x1] = False
    np.testing.assert_array_equal(result[untouched], grace[untouched])
    centre = plan.target_face.eye_centre
    assert (result[int(centre[1]), int(centre[0])] != grace[int(centre[1]), int(centre[0])]).any()


def test_paste_back_refuses_nan_and_wrong_shapes(plan, grace):
    bad = np.full((SIZE, SIZE, 3), 0.5, dtype=np.float32)
    bad[10, 10, 1] = np.nan
    with pytest.raises(PixelError, match="NaN"):
        paste_back(grace, bad, plan)
    with pytest.raises(PixelError, match="generated crop"):
        paste_back(grace, np.zeros((SIZE // 2, SIZE // 2, 3), np.float32), plan)
    with pytest.raises(PixelError, match="target"):
        paste_back(grace.astype(np.float32), plan.composite, plan)


def test_plan_crosses_a_tensor_boundary(plan, grace):
    composite, mask, crop_box = plan.to_arrays()
    assert composite.dtype == np.float32 and composite.shape == (SIZE, SIZE, 3)
    assert mask.dtype == np.float32 and mask.shape == (SIZE, SIZE)
    assert crop_box.dtype == np.int64 and crop_box.shape == (4,)
    rebuilt = FusionPlan.from_arrays(composite[None], mask[None], crop_box[None])
    assert rebuilt.crop_box == plan.crop_box and rebuilt.source_face is None
    np.testing.assert_array_equal(
        paste_back(grace, composite, rebuilt), paste_back(grace, composite, plan)
    )
    with pytest.raises(PixelError):
        FusionPlan.from_arrays(composite, mask[:, :-1], crop_box)
    with pytest.raises(PixelError):
        FusionPlan.from_arrays(composite, mask, crop_box.astype(np.float32))
    with pytest.raises(PixelError):
        FusionPlan.from_arrays(composite, mask, np.array([5, 5, 5, 9], np.int64))


def test_missing_faces_name_the_field(astronaut):
    flat = np.full((120, 120, 3), 180, dtype=np.uint8)
    with pytest.raises(NoFaceFound) as info:
        prepare_fusion(flat, astronaut, SIZE)
    assert info.value.field == "SOURCE_IMAGE"
    with pytest.raises(NoFaceFound) as info:
        prepare_fusion(astronaut, flat, SIZE)
    assert info.value.field == "TARGET_IMAGE"
    with pytest.raises(NoFaceFound) as info:  # both missing: the source is named, as before
        prepare_fusion(flat, flat, SIZE)
    assert info.value.field == "SOURCE_IMAGE"


def test_detection_threads_give_the_faces_of_one_thread(astronaut, grace):
    """The two faces are found on two threads with their own detectors: the same plan as
    detecting them one after the other, and concurrent callers do not disturb each other."""
    from concurrent.futures import ThreadPoolExecutor

    from facefuse.face.detect import detect_face

    plan = prepare_fusion(grace, astronaut, SIZE)
    assert plan.source_face == detect_face(grace, "SOURCE_IMAGE")
    assert plan.target_face == detect_face(astronaut, "TARGET_IMAGE")
    with ThreadPoolExecutor(4) as pool:
        plans = list(pool.map(lambda _: prepare_fusion(grace, astronaut, SIZE), range(8)))
    for other in plans:
        np.testing.assert_array_equal(other.composite, plan.composite)


def test_target_smaller_than_the_crop_is_padded(astronaut, grace):
    # B is a tight crop around the face: the square crop needs more than B has
    tight = np.ascontiguousarray(astronaut[70:190, 170:280])
    fusion = prepare_fusion(grace, tight, 128, ("hog", "hog-rotated"))
    x0, y0, x1, y1 = fusion.crop_box
    assert x1 - x0 == y1 - y0 and (x0 < 0 or y0 < 0 or x1 > 110 or y1 > 120)
    result = paste_back(tight, fusion.composite, fusion)
    assert result.shape == tight.shape and result.dtype == np.uint8


def test_crop_box_stays_inside_when_it_fits():
    ellipse = geometry.Ellipse((20.0, 30.0), (10.0, 14.0), 0.0)
    x0, y0, x1, y1 = geometry.crop_box(ellipse, (200, 300, 3))
    side = round(geometry.CROP_FACTOR * 14)
    assert (x0, y0) == (0, 30 - side // 2) and x1 - x0 == y1 - y0 == side  # shifted right
    x0, y0, x1, y1 = geometry.crop_box(ellipse, (30, 300, 3))  # only 30 px tall
    assert y1 - y0 >= 28 and x1 - x0 == y1 - y0


def test_similarity_transform_recovers_a_known_transform():
    angle, scale, shift = math.radians(20), 1.7, np.array([12.0, -5.0])
    rotation = scale * np.array(
        [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]]
    )
    source = np.array([[10.0, 10.0], [40.0, 12.0], [25.0, 35.0]])
    target = source @ rotation.T + shift
    matrix = geometry.similarity_transform(source, target)
    np.testing.assert_allclose(matrix[:, :2], rotation, atol=1e-9)
    np.testing.assert_allclose(matrix[:, 2], shift, atol=1e-9)
    two = geometry.similarity_transform(source[:2], target[:2])
    np.testing.assert_allclose(geometry.apply(two, source[:2]), target[:2], atol=1e-9)
    with pytest.raises(ValueError):
        geometry.similarity_transform(source[:1], target[:1])


def test_feathered_mask_ramps_between_zero_and_one():
    ellipse = geometry.Ellipse((64.0, 64.0), (30.0, 40.0), 15.0)
    mask = feathered_ellipse(ellipse, (128, 128))
    assert mask[64, 64] == 1.0 and mask[0, 0] == 0.0 and mask[64, 127] == 0.0
    ramp = (mask > 0) & (mask < 1)
    assert ramp.sum() > 200  # feathered, not hard-edged
    hard = np.zeros((128, 128), np.uint8)
    cv2.ellipse(hard, (64, 64), (36, 46), 15.0, 0, 360, 1, -1)  # the ellipse grown by 6 px
    assert not (mask[hard == 0] > 0).any()


def test_match_color_moves_statistics_to_the_target():
    rng = np.random.default_rng(2)
    source = np.clip(rng.normal((0.8, 0.3, 0.3), 0.05, size=(64, 64, 3)), 0, 1).astype(np.float32)
    target = np.clip(rng.normal((0.3, 0.4, 0.7), 0.08, size=(64, 64, 3)), 0, 1).astype(np.float32)
    region = np.zeros((64, 64), bool)
    region[16:48, 16:48] = True
    matched = match_color(source, target, region, region)
    assert matched.dtype == np.float32 and 0 <= matched.min() and matched.max() <= 1
    got = matched[region].mean(axis=0)
    want = target[region].mean(axis=0)
    np.testing.assert_allclose(got, want, atol=0.03)
    empty = np.zeros((64, 64), bool)
    np.testing.assert_array_equal(match_color(source, target, empty, region), source)


def test_feather_widens_the_ramp_and_out_of_range_is_refused():
    from facefuse.face.geometry import Ellipse
    from facefuse.face.mask import feathered_ellipse

    ellipse = Ellipse((64.0, 64.0), (30.0, 40.0), 0.0)
    narrow, wide = (feathered_ellipse(ellipse, (128, 128), f) for f in (0.1, 0.3))
    ramp = lambda m: int(((m > 0) & (m < 1)).sum())  # noqa: E731
    assert ramp(wide) > ramp(narrow) and (wide == 1).sum() < (narrow == 1).sum()
    with pytest.raises(ValueError, match="feather"):
        feathered_ellipse(ellipse, (128, 128), 1.5)


def test_paste_mask_grows_the_ellipse_and_stops_at_the_outline():
    from facefuse.face.mask import paste_mask

    ellipse = geometry.Ellipse((64.0, 56.0), (24.0, 32.0), 0.0)
    everywhere = np.array([[0, 0], [127, 0], [127, 127], [0, 127]], np.float64)
    np.testing.assert_array_equal(
        paste_mask(ellipse, everywhere, (128, 128), growth=1.0),
        feathered_ellipse(ellipse, (128, 128)),
    )
    grown = paste_mask(ellipse, everywhere, (128, 128), growth=1.3)
    plain = feathered_ellipse(ellipse, (128, 128))
    assert (grown >= plain).all() and (grown == 1).sum() > (plain == 1).sum()
    top = int(np.argmax(plain[:, 64] > 0))  # the top stays where it was; it grows downwards
    assert abs(int(np.argmax(grown[:, 64] > 0)) - top) <= 1
    assert (grown[:, 64] > 0).sum() > (plain[:, 64] > 0).sum() + 10
    left_half = np.array([[0, 0], [64, 0], [64, 127], [0, 127]], np.float64)
    cut = paste_mask(ellipse, left_half, (128, 128), growth=1.3)
    # 0 past the outline's blur (the feather width), untouched well inside it
    assert (cut[:, 64 + 6 :] == 0).all() and (cut[:, :40] == grown[:, :40]).all()
    assert 0.3 < cut[56, 64] < 0.7
    with pytest.raises(ValueError, match="growth"):
        paste_mask(ellipse, everywhere, (128, 128), growth=0.9)
    with pytest.raises(ValueError, match="outline"):
        paste_mask(ellipse, everywhere[:2], (128, 128))


def test_expression_paste_reaches_past_the_face_ellipse(grace, astronaut):
    """With the expression stage A's face is pasted past the face ellipse (cheeks, jaw); where
    it stops (A's outline) is paste_mask's test."""
    from facefuse.face.expression_edit import ExpressionEdit
    from facefuse.face.mask import PASTE_GROWTH

    plan = prepare_fusion(grace, astronaut, SIZE, expression=ExpressionEdit())
    target = plan.target_face
    ellipse = geometry.face_ellipse(target.left_eye, target.right_eye)
    ellipse = ellipse.mapped(geometry.box_to_square(plan.crop_box, SIZE))
    plain = feathered_ellipse(ellipse, (SIZE, SIZE))
    assert PASTE_GROWTH > 1.0
    assert (plan.mask > 0.5).sum() > 1.05 * (plain > 0.5).sum()
    assert (plan.mask[plain < 0.5] > 0.5).sum() > 100  # cheeks or jaw beyond the old ellipse
    assert plan.mask[0, 0] == 0 and plan.mask[-1, -1] == 0
