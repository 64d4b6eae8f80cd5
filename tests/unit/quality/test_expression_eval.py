"""Pure parts of the expression evaluation (issue 30): shares, corner rise, pairs."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.quality.fusion_eval import (
    EXPRESSION_CASES,
    SHEET_CASES,
    _expression_sheet,
    corner_rise,
    expression_pairs,
    smile_share,
)


def _face(corner_y: float, width: float) -> np.ndarray:
    points = np.zeros((68, 2))
    points[36], points[45] = (0.0, 0.0), (100.0, 0.0)  # outer eye corners: span 100
    points[48], points[54] = (50 - width / 2, corner_y), (50 + width / 2, corner_y)
    points[62], points[66] = (50.0, 80.0), (50.0, 84.0)  # inner lips' middle at y 82
    return points


def test_corner_rise_grows_as_the_corners_lift():
    assert corner_rise(_face(82.0, 50)) == pytest.approx(0.0)
    assert corner_rise(_face(77.0, 50)) == pytest.approx(0.05)


def test_smile_share_is_where_a_value_lies_between_a_persons_photos():
    assert smile_share(0.5, 0.4, 0.6) == pytest.approx(0.5)
    assert smile_share(0.4, 0.4, 0.6) == 0.0
    assert smile_share(0.5, 0.4, 0.4) is None  # the person's photos do not differ


def test_pairs_are_of_different_people_and_cover_everyone_first():
    ids = [f"{i:03d}" for i in range(6)]
    pairs = expression_pairs(ids, None, seed=3)
    assert len(pairs) == 6 and sorted(a for a, _ in pairs) == ids
    assert all(a != b for a, b in pairs)
    assert expression_pairs(ids, None, seed=3) == pairs
    assert len(expression_pairs(ids, 9, seed=3)) == 9


def test_cases_name_a_same_expression_photo_and_the_sheet_draws():
    assert set(SHEET_CASES) <= set(EXPRESSION_CASES)
    for a, b, instruction, same in EXPRESSION_CASES.values():
        assert {a, b, same} <= {"neutral", "smiling"} and instruction
    rows = [[np.zeros((100, 100, 3), np.uint8)] * 8]
    sheet = _expression_sheet(rows, ["pair"], [f"c{i}" for i in range(8)], tile=40)
    assert sheet.shape == (34 + 58, 320, 3)


def test_phrasing_cases_compare_with_make_them_smile_and_negations_with_neutral():
    from facefuse.quality.fusion_eval import CORE_CASES, PHRASING_CASES, _phrasings

    assert not set(PHRASING_CASES) & set(CORE_CASES) and len(CORE_CASES) == 6
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in v[2]) for v in PHRASING_CASES.values())
    summary = {
        "make_smile": {"smile_share_median": 1.0},
        "say_grin": {"smile_share_median": 0.6},
        "say_zh_smile": {"smile_share_median": 0.4},
        "neg_dont": {"smile_share_median": 0.05},
    }
    out = _phrasings(summary)
    assert out["smile_over_make_smile"] == {"say_grin": 0.6, "say_zh_smile": 0.4}
    assert out["smile_at_least_half"] is False and out["negations_at_most_half"] is True
    assert _phrasings({"make_smile": {"smile_share_median": 1.0}}) == {}
