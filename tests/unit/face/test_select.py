"""Several faces in B: find them all, fuse the largest, all, or the one like a reference."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from facefuse.core.errors import NoFaceFound
from facefuse.face.detect import find_face, find_faces
from facefuse.face.expression_edit import ExpressionEdit
from facefuse.face.fusion import paste_back, prepare_fusion
from facefuse.face.select import choose


@pytest.fixture(scope="module")
def two_people(astronaut, grace):
    """Grace Hopper (larger) beside the astronaut, on one canvas."""
    grace = cv2.resize(grace, (512, 600))
    canvas = np.full((600, 1024, 3), 200, np.uint8)
    canvas[:600, :512] = grace
    canvas[44:556, 512:] = astronaut
    return canvas


def test_every_face_is_found_largest_first(two_people):
    faces = find_faces(two_people)
    assert len(faces) == 2
    areas = [(f.box[2] - f.box[0]) * (f.box[3] - f.box[1]) for f in faces]
    assert areas == sorted(areas, reverse=True)
    assert faces[0].box == find_face(two_people).box
    assert find_faces(np.full((200, 200, 3), 128, np.uint8)) == []
    assert len(find_faces(two_people, small=True)) == 2  # no badge taken for a small face


def test_choose_largest_all_and_reference(two_people, astronaut, grace):
    faces = find_faces(two_people)
    assert choose(two_people, faces)[0] == [0]
    assert choose(two_people, faces, "all")[0] == [0, 1]
    astronaut_index = int(np.argmax([f.box[0] for f in faces]))  # the right-hand face
    chosen, info = choose(two_people, faces, "reference", astronaut)
    assert chosen == [astronaut_index] and info["found"] == 2
    assert min(info["reference_distances"]) < 0.6 < max(info["reference_distances"])
    with pytest.raises(NoFaceFound) as caught:
        choose(two_people, faces, "reference", np.full((100, 100, 3), 90, np.uint8))
    assert caught.value.field == "REFERENCE_FACE"


def test_fusion_of_each_chosen_face(two_people, grace):
    edit = ExpressionEdit(face_select="all")
    result = two_people
    boxes = []
    for index in range(2):
        plan = prepare_fusion(grace, two_people, 128, expression=ExpressionEdit(
            face_select="all", face_index=index))  # fmt: skip
        assert plan.info["faces"]["fused"] == [0, 1] and plan.info["faces"]["this"] == index
        boxes.append(plan.crop_box)
        result = paste_back(result, plan.composite, plan)
    assert boxes[0] != boxes[1]
    changed = np.any(result != two_people, axis=2)
    assert changed[:, :512].any() and changed[:, 512:].any()  # both faces replaced
    with pytest.raises(ValueError, match="face_index"):
        prepare_fusion(grace, two_people, 128, expression=ExpressionEdit(face_index=1))
    assert edit.face_select == "all"


@pytest.fixture(scope="module")
def small_and_large(grace):
    """Grace Hopper twice on a 640x480 frame: her face ~120 px and ~48 px wide (the second
    under HOG's 80 px window, as faces in a crowd are)."""
    canvas = np.full((480, 640, 3), 190, np.uint8)
    for face_px, (x, y) in ((120, (20, 40)), (48, (450, 200))):
        scale = face_px / 216  # her face is ~216 px wide in the 512 x 600 photo
        small = cv2.resize(grace, (round(512 * scale), round(600 * scale)), cv2.INTER_AREA)
        canvas[y : y + small.shape[0], x : x + small.shape[1]] = small
    return canvas


def test_all_finds_faces_down_to_40_px_as_dlib_upsampled_does(small_and_large):
    import dlib

    assert len(find_faces(small_and_large)) == 1  # the main-face path: HOG's window only
    faces = find_faces(small_and_large, small=True)
    widths = sorted(f.box[2] - f.box[0] for f in faces)
    reference = sorted(r.width() for r in dlib.get_frontal_face_detector()(small_and_large, 1))
    assert len(faces) == len(reference) == 2 and 40 <= widths[0] < 80
    assert all(abs(a - b) <= 2 for a, b in zip(widths, reference, strict=True))


def test_all_fuses_the_small_face_too(small_and_large, grace):
    result = small_and_large
    for index in range(2):
        plan = prepare_fusion(grace, small_and_large, 128, expression=ExpressionEdit(
            face_select="all", face_index=index))  # fmt: skip
        assert plan.info["faces"]["fused"] == [0, 1]
        result = paste_back(result, plan.composite, plan)
    changed = np.any(result != small_and_large, axis=2)
    assert changed[200:340, 450:570].any() and changed[40:300, 20:260].any()
