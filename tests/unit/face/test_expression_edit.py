"""Whose expression, the edits on top, the request fields, and the fusion that applies them."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from facefuse.core import contract as c
from facefuse.core.errors import InvalidInput
from facefuse.face.expression_edit import (
    ExpressionEdit,
    _local_words,
    expression_part,
    words_from_instruction,
)

A = np.array([0.2, 0.1, 0.5, -0.5])  # source's own coefficients (smile, open, mode1, mode2)
B = np.array([1.1, 0.05, -0.3, 0.2])  # target's


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("make them smile", (False, 1.0, 0.0)),
        ("keep a neutral expression", (True, 0.0, 0.0)),
        ("make her smile slightly", (False, 0.5, 0.0)),
        ("a big smile please", (False, 1.5, 0.0)),
        ("don't smile", (True, 0.0, 0.0)),
        ("open mouth", (False, 0.0, 1.0)),
        ("keep the glasses", (False, 0.0, 0.0)),
    ],
)
def test_words(text, expected):
    for reading in (_local_words(text), words_from_instruction(text)):
        assert (reading["reset"], reading["smile"], reading["mouth_open"]) == expected


BAND = np.array([0.3, 0.15, 1.0, 2.0])


def test_expression_part_is_beyond_the_neutral_band_and_smile_and_open_only():
    part = expression_part(np.array([1.0, 0.5, 3.0, 3.0]), BAND)
    assert np.allclose(part, [0.7, 0.35, 0.0, 0.0])
    assert np.allclose(expression_part(np.array([0.2, 0.1, 0.0, 0.0]), BAND), 0)


def test_lips_pressed_tighter_than_neutral_are_not_undone():
    """A's tightly closed lips (mouth_open below the band) are A's face: with B's closed mouth
    carried over nothing opens them (that parted A's lips onto B's teeth: a grimace)."""
    assert np.allclose(expression_part(np.array([-1.0, -0.5, 0.0, 0.0]), BAND), [-0.7, 0, 0, 0])
    own = np.array([0.0, -0.6, 0.0, 0.0])
    wanted, applied = ExpressionEdit().wanted(own, np.zeros(4), BAND)
    assert np.allclose(wanted, own) and applied["expression"]["source"]["mouth_open"] == 0.0


def test_default_takes_the_targets_expression_part():
    wanted, applied = ExpressionEdit(gain=1.0, transfer_gain=1.0).wanted(A, B, BAND)
    # A's smile 0.2 is within the band (face shape, kept); B's 1.1 gives 0.8 of expression
    assert wanted[0] == pytest.approx(A[0] + 0.8)
    assert np.allclose(wanted[1:], A[1:])  # B's open 0.05 is in the band; modes 1-2 stay A's
    assert applied["source"] == "target" and applied["smile"] == 0 and not applied["reset"]
    assert applied["expression"]["target"]["smile"] == pytest.approx(0.8)


def test_gain_multiplies_increases_only():
    wanted, _ = ExpressionEdit(gain=2.0, transfer_gain=1.5).wanted(A, B, BAND)
    assert wanted[0] == pytest.approx(A[0] + 1.2)  # B's own smile: the transfer gain
    words = {"reset": False, "smile": 1.0, "mouth_open": 0.0}
    wanted, _ = ExpressionEdit(gain=2.0, transfer_gain=1.5, words=words).wanted(A, B, BAND)
    assert wanted[0] == pytest.approx(A[0] + 2.0)  # the words set it: the warp gain
    smiling_a = np.array([1.5, 0.0, 0.0, 0.0])
    wanted, _ = ExpressionEdit(gain=2.0).wanted(smiling_a, np.zeros(4), BAND)
    assert wanted[0] == pytest.approx(0.3)  # A's smile taken out, no more (decreases x1)


def test_source_keeps_as_own_expression():
    wanted, _ = ExpressionEdit(source="source").wanted(A, B, BAND)
    assert np.allclose(wanted, A)


def test_smile_words_raise_the_smile_to_their_level_only():
    words = {"reset": False, "smile": 1.0, "mouth_open": 0.0}
    wanted, applied = ExpressionEdit(source="source", words=words, gain=1.0).wanted(A, B, BAND)
    assert wanted[0] == pytest.approx(A[0] + 1.0) and np.allclose(wanted[1:], A[1:])
    assert applied["smile"] == pytest.approx(1.0) and applied["from"]["smile"] == "instruction"
    # a target already smiling more keeps its smile
    edit = ExpressionEdit(words={**words, "smile": 0.5}, gain=1.0, transfer_gain=1.0)
    wanted, _ = edit.wanted(A, B, BAND)
    assert wanted[0] == pytest.approx(A[0] + 0.8)


def test_reset_takes_the_expression_out_and_open_mouth_parts_the_lips():
    reset = {"reset": True, "smile": 0.0, "mouth_open": 0.0}
    smiling_a = np.array([1.5, 0.4, 0.5, 0.5])
    wanted, applied = ExpressionEdit(words=reset).wanted(smiling_a, B, BAND)
    assert np.allclose(wanted, [0.3, 0.15, 0.5, 0.5]) and applied["reset"]
    opened = {"reset": False, "smile": 0.0, "mouth_open": 1.0}
    wanted, _ = ExpressionEdit(words=opened, gain=1.0, transfer_gain=1.0).wanted(A, B, BAND)
    assert wanted[1] == pytest.approx(A[1] + 1.0) and wanted[0] == pytest.approx(A[0] + 0.8)


def test_numbers_add_to_the_chosen_expression_and_override_the_words():
    words = {"reset": True, "smile": 0.0, "mouth_open": 1.0}
    edit = ExpressionEdit(smile=0.5, mouth_open=0.2, words=words, gain=1.0, transfer_gain=1.0)
    wanted, applied = edit.wanted(A, B, BAND)
    assert wanted[0] == pytest.approx(A[0] + 0.8 + 0.5)
    assert wanted[1] == pytest.approx(A[1] + 0.2)
    assert applied["from"] == {"smile": "request", "mouth_open": "request"}
    assert applied["smile"] == 0.5 and not applied["reset"]


def test_json_round_trip():
    edit = ExpressionEdit(source="source", smile=-0.5, words=_local_words("open mouth"))
    assert ExpressionEdit.from_json(edit.to_json()) == edit
    assert ExpressionEdit.from_json("{}") == ExpressionEdit()
    with pytest.raises(ValueError):
        ExpressionEdit.from_json("[1, 2]")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"source": "both"}, "EXPRESSION_SOURCE"),
        ({"smile": 2.5}, "EXPRESSION_SMILE"),
        ({"smile": float("nan")}, "EXPRESSION_SMILE"),
        ({"mouth_open": -0.1}, "EXPRESSION_MOUTH_OPEN"),
        ({"mouth_open": 1.01}, "EXPRESSION_MOUTH_OPEN"),
    ],
)
def test_out_of_range_fields_are_refused_by_name(kwargs, field):
    with pytest.raises(InvalidInput) as caught:
        ExpressionEdit(**kwargs)
    assert caught.value.field == field
    request_kwargs = {f"expression_{k}": v for k, v in kwargs.items()}
    with pytest.raises(InvalidInput) as caught:
        c.facefusion_request(b"a", b"b", "make them smile", **request_kwargs)
    assert caught.value.field == field


def test_request_builder_sends_only_given_fields():
    tensors = c.facefusion_request(b"a", b"b", "x", expression_smile=1.5)
    assert tensors["EXPRESSION_SMILE"].dtype == np.float32
    assert "EXPRESSION_SOURCE" not in tensors and "EXPRESSION_MOUTH_OPEN" not in tensors
    tensors = c.facefusion_request(b"a", b"b", "x", expression_source="source")
    assert tensors["EXPRESSION_SOURCE"][0] == b"source"


def test_fusion_moves_as_face_and_reports_it(grace, astronaut):
    from facefuse.face import expression as ex
    from facefuse.face import facemesh as fm
    from facefuse.face import geometry
    from facefuse.face.fusion import prepare_fusion

    before = prepare_fusion(grace, astronaut, 256)
    assert before.info == {}
    edit = ExpressionEdit(source="source", smile=1.5)
    plan = prepare_fusion(grace, astronaut, 256, expression=edit)
    info = plan.info["expression"]
    assert info["source"] == "source" and info["smile"] == 1.5
    assert info["coefficients"]["applied"]["smile"] == pytest.approx(
        info["coefficients"]["source"]["smile"] + 1.5 * edit.gain, abs=1e-3
    )
    json.dumps(plan.info)  # JSON-ready
    # the same crop box; the paste reaches past the plain paste's ellipse to A's outline;
    # against A's own expression (the same forehead occlusion) the composite differs below the
    # eyes only (a smile moves the mouth and raises the cheeks)
    assert plan.crop_box == before.crop_box and plan.mask.sum() > 1.05 * before.mask.sum()
    own = prepare_fusion(grace, astronaut, 256, expression=ExpressionEdit(source="source"))
    changed = np.abs(plan.composite - own.composite).max(axis=2) > 0.1
    assert changed.any()
    eyes = geometry.apply(
        before.source_to_crop, np.array([before.source_face.left_eye, before.source_face.right_eye])
    )
    rows = np.nonzero(changed)[0]
    assert rows.mean() > eyes[:, 1].max() + 10  # mouth and cheeks, below the eyes
    # the mouth in the composite is wider: measure it with FaceMesh on the crop
    crop = np.rint(plan.composite * 255).astype(np.uint8)
    moved = fm.mesh_from_eyes(crop, tuple(eyes[0]), tuple(eyes[1]))
    kept = fm.mesh_from_eyes(
        np.rint(before.composite * 255).astype(np.uint8), tuple(eyes[0]), tuple(eyes[1])
    )
    assert ex.mouth_width(moved.points) > ex.mouth_width(kept.points) + 0.02
    # no expression change asked of A's own expression: inside the plain paste's ellipse the
    # composite matches the plain paste
    same = prepare_fusion(grace, astronaut, 256, expression=replace(edit, smile=0.0))
    inside = before.mask > 0.99
    assert np.abs(same.composite - before.composite)[inside].mean() < 0.01


def test_mouth_fill_only_for_parted_lips():
    from facefuse.face.fusion import DARK_MOUTH, TEETH, fill_mouth

    size = 64
    crop = np.full((size, size, 3), 0.5, np.float32)
    target = np.zeros((size, size, 3), np.float32)
    target[28:36, 20:44] = (0.9, 0.9, 0.9)  # B's teeth
    angles = np.linspace(0, 2 * np.pi, 20, endpoint=False)
    closed = np.stack([32 + 12 * np.cos(angles), 32 + 0.5 * np.sin(angles)], 1)
    opened = np.stack([32 + 12 * np.cos(angles), 32 + 6 * np.sin(angles)], 1)
    out, kind = fill_mouth(crop, target, closed, closed, 0.0)
    assert kind == "none" and out is crop
    out, kind = fill_mouth(crop, target, opened, opened, 0.0)
    assert kind == "teeth" and np.allclose(out[32, 32], TEETH, atol=0.02)
    assert out[32, 21].sum() < out[32, 32].sum() - 0.5  # shaded dark towards the lips
    out, kind = fill_mouth(crop, target, opened, opened, 0.0, opened=True)
    assert kind == "dark" and np.allclose(out[32, 32], DARK_MOUTH)
    # lips that were parted before the warp are not filled again
    out, kind = fill_mouth(crop, target, opened, opened, 0.0, own_lips=opened)
    assert kind == "none"
    out, kind = fill_mouth(crop, target, opened, opened, 0.1)
    assert kind == "target" and np.allclose(out[32, 32], 0.9, atol=0.01)
    assert np.array_equal(out[:20], crop[:20])  # outside the lips nothing changes
