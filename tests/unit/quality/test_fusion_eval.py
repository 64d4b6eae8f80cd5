"""fusion-eval: the pure measures on synthetic inputs, the dlib instruments on the sample photos
(scikit-image's astronaut, matplotlib's Grace Hopper) and the run with a stand-in for the server."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from facefuse.cli import main
from facefuse.face.fusion import FusionPlan, paste_back
from facefuse.face.geometry import Ellipse
from facefuse.face.imageio import decode_image, encode_png
from facefuse.face.mask import feathered_ellipse
from facefuse.quality import fusion_eval as fe
from facefuse.quality.metrics import PSNR_CAP_DB

ROOT = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------------- pure measures


def test_box_iou_known_values():
    assert fe.box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert fe.box_iou((0, 0, 10, 10), (10, 0, 20, 10)) == 0.0  # touching, exclusive x1
    assert fe.box_iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert fe.box_iou((0, 0, 10, 10), (2, 2, 8, 8)) == pytest.approx(36 / 100)
    assert fe.box_iou((0, 0, 0, 10), (0, 0, 0, 10)) == 0.0  # empty boxes


def test_best_overlap_picks_the_box_over_the_reference():
    assert fe.best_overlap([], (0, 0, 10, 10)) == (None, 0.0)
    index, iou = fe.best_overlap([(50, 50, 60, 60), (1, 1, 11, 11)], (0, 0, 10, 10))
    assert index == 1 and iou == pytest.approx(81 / 119)


def _points68(mouth: float, eyes: float) -> np.ndarray:
    points = np.zeros((68, 2))
    points[36], points[45] = (100 - eyes / 2, 100), (100 + eyes / 2, 100)
    points[48], points[54] = (100 - mouth / 2, 160), (100 + mouth / 2, 160)
    return points


def test_expression_ratio_is_mouth_over_outer_eye_span_and_scale_free():
    assert fe.expression_ratio(_points68(40, 80)) == pytest.approx(0.5)
    assert fe.expression_ratio(_points68(40, 80) * 3) == pytest.approx(0.5)
    assert fe.expression_ratio(_points68(48, 80)) > fe.expression_ratio(_points68(40, 80))
    with pytest.raises(ValueError, match="68"):
        fe.expression_ratio(np.zeros((5, 2)))
    with pytest.raises(ValueError, match="coincide"):
        fe.expression_ratio(_points68(40, 0))


def test_descriptor_distance():
    assert fe.descriptor_distance(np.zeros(128), np.zeros(128)) == 0.0
    assert fe.descriptor_distance([3, 0], [0, 4]) == pytest.approx(5.0)
    with pytest.raises(ValueError):
        fe.descriptor_distance(np.zeros(128), np.zeros(64))


def _plan(target_shape, box, size=64) -> FusionPlan:
    half = size / 2
    mask = feathered_ellipse(Ellipse((half, half), (half * 0.6, half * 0.8), 0.0), (size, size))
    return FusionPlan(np.zeros((size, size, 3), np.float32), mask, box)


def test_outside_face_matches_what_paste_back_changes():
    target = np.full((120, 100, 3), 200, np.uint8)
    plan = _plan(target.shape, (20, 30, 84, 94))
    outside = fe.outside_face(target.shape, plan.mask, plan.crop_box)
    assert outside.shape == (120, 100)
    assert outside[:30].all() and outside[94:].all() and outside[:, :20].all()
    pasted = paste_back(target, np.zeros((64, 64, 3), np.float32), plan)
    changed = np.any(pasted != target, axis=2)
    assert changed[~outside].any()  # the face region is regenerated
    assert changed[outside].any()  # the outer ramp (mask < 0.5) is changed too: PSNR finite
    heavy = np.abs(pasted.astype(int) - target).max(axis=2) > 110  # weight > ~0.55
    assert not (heavy & outside).any()
    # the face region is about the ellipse's area (pi * 0.6 * 0.8 * 32^2 px)
    assert 0.5 < (~outside).sum() / (math.pi * 0.6 * 0.8 * 32**2) < 1.5


def test_outside_face_clips_a_box_past_the_border():
    plan = _plan((50, 50, 3), (-10, -10, 54, 54))
    outside = fe.outside_face((50, 50, 3), plan.mask, plan.crop_box)
    assert outside.shape == (50, 50) and (~outside).any() and outside[0, 0]


def test_masked_psnr_only_counts_the_selected_pixels():
    rng = np.random.default_rng(0)
    reference = rng.integers(0, 200, (40, 30, 3)).astype(np.uint8)
    where = np.zeros((40, 30), bool)
    where[:20] = True
    candidate = reference.copy()
    assert fe.masked_psnr(reference, candidate, where) == PSNR_CAP_DB
    candidate[20:] = 0  # outside the selection: ignored
    assert fe.masked_psnr(reference, candidate, where) == PSNR_CAP_DB
    candidate[:20] += 10
    assert fe.masked_psnr(reference, candidate, where) == pytest.approx(20 * math.log10(25.5))
    with pytest.raises(ValueError, match="no pixel"):
        fe.masked_psnr(reference, candidate, np.zeros((40, 30), bool))
    with pytest.raises(ValueError, match="shape"):
        fe.masked_psnr(reference, candidate[:10], where)


def test_select_pairs_all_ordered_pairs_of_different_people_or_a_seeded_draw():
    ids = ["a", "b", "c"]
    pairs = fe.select_pairs(ids, ids, None, 0)
    assert len(pairs) == 6 and all(a != b for a, b in pairs)
    assert fe.select_pairs(ids, ids, 99, 0) == pairs
    drawn = fe.select_pairs(ids, ids, 3, 5)
    assert len(drawn) == 3 and set(drawn) <= set(pairs) and drawn == sorted(drawn)
    assert drawn == fe.select_pairs(ids, ids, 3, 5)
    assert fe.select_pairs(["a"], ["a"], None, 0) == []


def test_parse_ids():
    assert fe.parse_ids("001, 002\n003 # comment\n\n002") == ["001", "002", "003"]


def _variant(found, da, db, expression, psnr):
    return {
        "face_found": found,
        "distance_a": da,
        "distance_b": db,
        "expression": expression,
        "psnr_outside_db": psnr,
    }


def test_summarize_counts_skips_and_reports_shares_and_medians():
    pairs = [
        {
            "a": "1",
            "b": "2",
            "paste_only": _variant(True, 0.3, 0.6, 0.7, 50.0),
            "neutral": _variant(True, 0.4, 0.5, 0.70, 40.0),
            "smile": _variant(False, 0.7, 0.5, 0.77, 38.0),
        },
        {
            "a": "2",
            "b": "1",
            "paste_only": _variant(True, 0.5, 0.4, 0.7, 52.0),
            "neutral": _variant(True, 0.6, 0.5, 0.80, 42.0),
            "smile": _variant(True, 0.6, 0.5, 0.72, 36.0),
        },
        {"a": "1", "b": "3", "skipped": "no face"},
    ]
    summary = fe.summarize(pairs, [100.0, 300.0, 200.0])
    assert summary["pairs"] == 3 and summary["evaluated"] == 2
    assert summary["skipped"] == {"no face": 1}
    assert summary["paste_only"]["nearer_a_share"] == 0.5
    assert summary["paste_only"]["median_distance_a"] == pytest.approx(0.4)
    assert summary["neutral"]["nearer_a_share"] == 0.5
    assert summary["smile"]["face_found_share"] == 0.5
    assert summary["smile"]["psnr_outside_min_db"] == 36.0
    assert summary["neutral"]["psnr_outside_median_db"] == pytest.approx(41.0)
    effect = summary["instruction_effect"]
    assert effect["n"] == 2 and effect["smile_wider_share"] == 0.5
    assert effect["median_smile_over_neutral"] == pytest.approx((1.1 + 0.9) / 2)
    assert summary["latency_ms"] == {"requests": 3, "median": 200.0}
    empty = fe.summarize([])
    assert empty["evaluated"] == 0 and empty["neutral"]["nearer_a_share"] is None
    json.dumps(summary)


def test_expression_check_on_hand_made_ratios():
    check = fe.expression_check({"1": (0.7, 0.8), "2": (0.7, 0.69), "3": (None, 0.8)})
    assert check["people"] == 2 and check["separated"] == 1
    assert check["not_separated"] == ["2"] and check["no_face"] == ["3"]


def test_contact_sheet_layout():
    image = np.full((50, 40, 3), 255, np.uint8)
    sheet = fe.contact_sheet(
        [[image] * 5, [image, None, image, image, image]], ["r1", "r2"], cell=32
    )
    assert sheet.dtype == np.uint8 and sheet.shape[1] == 5 * 34
    assert sheet.shape[0] == 20 + 2 * (16 + 32 + 2)
    assert (sheet == 255).any()
    with pytest.raises(ValueError):
        fe.contact_sheet([[image] * 4], ["r1"])


def test_to_json_turns_numpy_into_python():
    data = fe.to_json({"a": np.float32(0.123456), "b": [np.int64(3), np.bool_(True)]})
    assert data == {"a": 0.1235, "b": [3, True]} and json.dumps(data)


def test_the_68_point_model_stays_out_of_the_serving_path():
    serving = [
        *(ROOT / "facefuse" / "face").glob("*.py"),
        *(ROOT / "facefuse" / "diffusion").glob("*.py"),
    ]
    serving += [
        *(ROOT / "model_repository").glob("*/1/model.py"),
        *(ROOT / "facefuse" / "serving").glob("*.py"),
    ]
    assert serving
    for path in serving:
        text = path.read_text()
        assert "68_face" not in text and "fusion_eval" not in text, path


# ------------------------------------------------------------ dlib instruments on real photos


@pytest.fixture(scope="module")
def meter():
    return fe.FaceMeter()


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    from facefuse.core.samples import write_samples

    folder = tmp_path_factory.mktemp("photos")
    write_samples(folder)
    return folder


def _rgb(path: Path) -> np.ndarray:
    return decode_image(path.read_bytes(), path.name)


def test_meter_finds_one_face_per_sample_and_tells_people_apart(meter, photos):
    faces = {p.stem: meter.main_face(_rgb(p)) for p in sorted(photos.iterdir())}
    assert set(faces) == {"astronaut", "grace_hopper"} and all(faces.values())
    for face in faces.values():
        assert face.points.shape == (68, 2) and face.descriptor.shape == (128,)
        assert 0.4 < face.expression < 1.2
    apart = fe.descriptor_distance(faces["astronaut"].descriptor, faces["grace_hopper"].descriptor)
    assert apart > fe.SAME_PERSON_DISTANCE
    astronaut = _rgb(photos / "astronaut.png")
    mirrored = meter.main_face(np.ascontiguousarray(astronaut[:, ::-1]))
    same = fe.descriptor_distance(faces["astronaut"].descriptor, mirrored.descriptor)
    assert same < fe.SAME_PERSON_DISTANCE


def _echo_target(source: bytes, target: bytes, instruction: str) -> bytes:
    """A stand-in 'server' that answers B unchanged."""
    return encode_png(decode_image(target, "TARGET_IMAGE"))


def test_evaluate_with_a_server_that_answers_b_unchanged(meter, photos, tmp_path):
    blank = tmp_path / "blank"
    blank.mkdir()
    for p in photos.iterdir():
        (blank / p.name).write_bytes(p.read_bytes())
    Image.new("RGB", (200, 200), (128, 128, 128)).save(blank / "nobody.png")
    config = fe.EvalConfig(sources=blank, targets=blank, size=128)
    report, sheet = fe.evaluate(config, _echo_target, meter)
    summary = report["summary"]
    assert summary["pairs"] == 6 and summary["evaluated"] == 2
    assert summary["skipped"] == {"no face": 4}
    neutral, paste = summary["neutral"], summary["paste_only"]
    assert neutral["face_found_share"] == 1.0 and neutral["median_distance_b"] == 0.0
    assert neutral["nearer_a_share"] == 0.0 and neutral["psnr_outside_min_db"] == PSNR_CAP_DB
    assert paste["face_found_share"] == 1.0
    assert 0.0 < paste["median_distance_a"] < paste["median_distance_b"]  # A's face pasted in
    assert 25.0 < paste["psnr_outside_min_db"] < PSNR_CAP_DB  # the outer feather only
    assert summary["instruction_effect"]["median_smile_over_neutral"] == 1.0
    assert summary["latency_ms"]["requests"] == 4
    assert sheet is not None and sheet.shape[0] > 2 * 160
    json.dumps(fe.to_json(report))


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--sources", "{missing}", "--targets", "{photos}"], "--sources"),
        (["--sources", "{photos}", "--targets", "{empty}"], "--targets"),
        (["--sources", "{photos}", "--targets", "{photos}", "--pairs", "0"], "--pairs"),
        (["--sources", "{broken}", "--targets", "{photos}"], "--sources"),
        (["--sources", "{photos}", "--targets", "{photos}", "--ids", "astronaut,x"], "--ids"),
        (["--sources", "{photos}", "--targets", "{photos}", "--ids", "astronaut"], "--ids"),
        (["--sources", "{photos}", "--targets", "{photos}", "--steps", "0"], "--steps"),
        (
            ["--sources", "{photos}", "--targets", "{photos}", "--ids-file", "{missing}"],
            "--ids-file",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_field(args, field, photos, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "x.jpg").write_bytes(b"not a jpeg")
    names = {
        "missing": tmp_path / "missing",
        "photos": photos,
        "empty": tmp_path / "empty",
        "broken": tmp_path / "broken",
    }
    argv = ["fusion-eval", *(a.format(**names) for a in args), "--out", str(tmp_path / "out")]
    argv += ["--repository", str(tmp_path)]  # never reached: the inputs are refused first
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert f"error: {field}" in error, error
