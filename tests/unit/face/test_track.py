"""B's faces over frames: the One Euro filter, faces from meshes, tracking instead of detecting."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.face.lips import eye_opening, follow_eye_opening, follow_lip_gap, lip_gap
from facefuse.face.track import FaceTracker, OneEuroFilter, TrackSettings, face_from_mesh


def test_one_euro_is_steady_on_noise_and_follows_a_step():
    rng = np.random.default_rng(0)
    noisy = 10 + rng.normal(0, 1.0, 200)
    still = OneEuroFilter(min_cutoff=0.8, beta=0.0)
    out = np.array([still(x, 1 / 25) for x in noisy])
    assert out[50:].std() < 0.35 * noisy[50:].std()  # jitter removed
    moving = OneEuroFilter(min_cutoff=0.8, beta=2.0)
    step = np.r_[np.zeros(25), np.full(25, 100.0)]
    follow = np.array([moving(x, 1 / 25) for x in step])
    assert follow[24] == pytest.approx(0.0) and follow[-1] > 95  # reaches the new value
    assert OneEuroFilter(1.0, 0.0)(np.array([3.0, 4.0]), 0.04).tolist() == [3.0, 4.0]


def test_one_euro_refuses_bad_settings():
    with pytest.raises(ValueError):
        OneEuroFilter(0.0, 0.1)
    with pytest.raises(ValueError):
        TrackSettings(min_presence=1.5)
    with pytest.raises(ValueError):
        TrackSettings(detect_stages=())


def _clip(rgb: np.ndarray, count: int, shift: int = 2) -> list[np.ndarray]:
    """Frames of ``rgb`` moved right by ``shift`` pixels per frame (a slow pan)."""
    frames = []
    for i in range(count):
        moved = np.roll(rgb, i * shift, axis=1)
        frames.append(np.ascontiguousarray(moved))
    return frames


@pytest.fixture(scope="module")
def astronaut() -> np.ndarray:
    from facefuse.core.samples import sample_pair
    from facefuse.face.imageio import decode_image

    return decode_image(sample_pair()[1], "TARGET_IMAGE")


def test_tracker_detects_once_then_follows_the_face(astronaut):
    tracker = FaceTracker(TrackSettings(redetect_every=0))
    frames = _clip(astronaut, 8)
    xs = []
    for i, frame in enumerate(frames):
        tracks = tracker.update(frame, i / 25)
        assert len(tracks) == 1
        xs.append(tracks[0].face.eye_centre[0])
    assert tracker.detections == 1  # the first frame only: the rest were tracked
    moved = np.diff(xs)
    # follows the 2 px/frame pan (the first tracking pass may shift by a pixel or two: its ROI
    # differs from the detector's)
    assert np.median(moved) > 0 and abs(xs[-1] - xs[0] - 14) < 6
    assert tracks[0].face.detector == "facemesh-track"


def test_a_faceless_frame_loses_the_track_and_costs_one_detector_pass(astronaut):
    tracker = FaceTracker(TrackSettings(redetect_every=0))
    assert tracker.update(astronaut, 0.0)
    blank = np.full_like(astronaut, 127)
    assert tracker.update(blank, 0.04) == []
    assert tracker.lost == 1 and tracker.detections == 2
    assert tracker.update(astronaut, 0.08)  # back: found again
    assert tracker.detections == 3


def test_face_from_mesh_puts_eyes_between_the_corners(astronaut):
    from facefuse.face.detect import detect_face
    from facefuse.face.facemesh import face_mesh

    mesh = face_mesh(astronaut, detect_face(astronaut, "TARGET_IMAGE"))
    face = face_from_mesh(mesh, astronaut.shape)
    assert face.eye_distance > 20 and face.left_eye[0] < face.right_eye[0]
    x0, y0, x1, y1 = face.box
    assert 0 <= x0 < x1 <= astronaut.shape[1] and 0 <= y0 < y1 <= astronaut.shape[0]
    assert len(face.alignment_points()) == 3  # eyes and nose


def test_lips_and_eyelids_follow_the_wanted_opening(astronaut):
    from facefuse.face.detect import detect_face
    from facefuse.face.facemesh import face_mesh

    points = face_mesh(astronaut, detect_face(astronaut, "TARGET_IMAGE")).points
    for gap in (0.0, 0.05, 0.12):
        assert lip_gap(follow_lip_gap(points, gap)) == pytest.approx(gap, abs=1e-6)
    assert lip_gap(follow_lip_gap(points, -1.0)) == pytest.approx(0.0, abs=1e-6)
    opened = eye_opening(points)
    half = eye_opening(follow_eye_opening(points, np.array([0.5, 0.5])))
    assert half == pytest.approx(opened * 0.5, rel=0.1)
    moved = follow_lip_gap(points, 0.12) - points
    assert np.abs(moved[:100]).max() < 1e-9 or np.abs(moved[[33, 263, 1]]).max() < 1e-9
