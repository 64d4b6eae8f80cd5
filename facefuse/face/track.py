"""B's faces over the frames of a video: tracked from frame to frame, smoothed over time.

A :class:`FaceTracker` keeps one :class:`Track` per fused face. Each frame starts from the last
frame's raw points: one FaceMesh pass on MediaPipe's tracking ROI
(:func:`~facefuse.face.facemesh.track_mesh`), whose presence score says whether the face is
still there. The detector runs only when there is no track (the fast HOG stage alone, never the
whole cascade: a faceless frame costs one detector pass), and every
:attr:`TrackSettings.redetect_every` frames to pick up faces that came into view.

Steadiness without losing the mouth: a track's points are split into a similarity (centre,
log scale, angle of the eye line) and the shape left in that frame; each can be smoothed by a
One Euro filter (Casiez, Roussel and Vogel, CHI 2012: a low-pass whose cutoff rises with speed,
so a still face is steady and a moving one lags little). By default only the shape is (see
:class:`TrackSettings` for the measurements), and a stream reads the lips and eyelids from the
raw points, so they follow B frame by frame.

Invariants: a track's ``mesh`` is the smoothed one (what fusion uses), ``raw`` the network's
own (what the next frame's ROI is cut from); ``face`` is built from ``mesh``
(:func:`face_from_mesh`), so the crop, the ellipse and the alignment all move with the smoothed
points. The same frames in the same order give the same tracks (no randomness, no clocks:
time comes from the frames' timestamps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from facefuse.face.detect import Face, find_faces
from facefuse.face.facemesh import EYE_INNER, EYE_OUTER, Mesh, face_mesh, track_mesh

NOSE_BOTTOM = 2  # MediaPipe's point under the nose tip (dlib 5-point's nose, roughly)


def face_from_mesh(mesh: Mesh, image_shape: tuple[int, ...], detector: str = "facemesh") -> Face:
    """A :class:`Face` whose eyes are the midpoints of each eye's mesh corners and whose nose
    is the point under the nose tip; the box is the points' box clipped to the image. Streams
    build A's and B's faces this way, so alignment compares like with like."""
    p = mesh.points
    left = (p[EYE_OUTER[0]] + p[EYE_INNER[0]]) / 2
    right = (p[EYE_OUTER[1]] + p[EYE_INNER[1]]) / 2
    height, width = image_shape[:2]
    x0, y0 = np.floor(p.min(axis=0)).astype(int)
    x1, y1 = np.ceil(p.max(axis=0)).astype(int)
    x0, y0 = min(max(x0, 0), width - 1), min(max(y0, 0), height - 1)
    x1, y1 = max(min(x1, width), x0 + 1), max(min(y1, height), y0 + 1)
    nose = tuple(float(v) for v in p[NOSE_BOTTOM])
    return Face(
        box=(int(x0), int(y0), int(x1), int(y1)),
        left_eye=(float(left[0]), float(left[1])),
        right_eye=(float(right[0]), float(right[1])),
        nose=nose,
        landmarks=None,
        detector=detector,
        score=float(mesh.presence),
        angle=0.0,
        eyes_from="landmarks5",  # eyes and nose measured: alignment uses all three
    )


class OneEuroFilter:
    """The One Euro filter on arrays of any shape (each element filtered alike).

    ``min_cutoff`` (Hz): the cutoff of a still signal (lower is steadier); ``beta``: how fast
    the cutoff rises with the signal's speed (higher lags less); ``d_cutoff`` (Hz): the cutoff
    of the speed estimate. The first value passes unchanged; ``dt`` <= 0 repeats the last."""

    def __init__(self, min_cutoff: float, beta: float, d_cutoff: float = 1.0):
        if min_cutoff <= 0 or beta < 0 or d_cutoff <= 0:
            raise ValueError("OneEuroFilter: min_cutoff and d_cutoff must be > 0, beta >= 0")
        self.min_cutoff, self.beta, self.d_cutoff = float(min_cutoff), float(beta), d_cutoff
        self._x: np.ndarray | None = None
        self._dx: np.ndarray | None = None

    @staticmethod
    def _alpha(cutoff, dt: float):
        tau = 1.0 / (2 * math.pi * cutoff)
        return 1.0 / (1.0 + tau / dt)

    def __call__(self, x: np.ndarray, dt: float) -> np.ndarray:
        x = np.asarray(x, np.float64)
        if self._x is None:
            self._x, self._dx = x.copy(), np.zeros_like(x)
            return x.copy()
        if dt <= 0:
            return self._x.copy()
        dx = (x - self._x) / dt
        a_d = self._alpha(self.d_cutoff, dt)
        self._dx = self._dx + a_d * (dx - self._dx)
        cutoff = self.min_cutoff + self.beta * np.abs(self._dx)
        a = self._alpha(cutoff, dt)
        self._x = self._x + a * (x - self._x)
        return self._x.copy()


@dataclass(frozen=True)
class TrackSettings:
    """How B's faces are followed; see the module docstring.

    ``min_presence``: FaceMesh's face probability under which a track is lost;
    ``redetect_every``: frames between detector passes while tracking (0: never);
    ``detect_stages``: the detector stages used in a stream (the fast one: a frame without a
    face must stay cheap); ``pose_cutoff`` / ``pose_beta``: One Euro on the similarity (centre
    in eye spans, log scale, angle), None: not filtered; ``shape_cutoff`` / ``shape_beta``: on
    the shape. Measured on real clips (docs/benchmarks.md, "Video and live fusion"): any
    filtering of the pose made the face lag B's head (flow-warping error 2.5-5.9x the
    input's on a handheld clip, 1.8x unfiltered), the network's own pose being steady; the
    shape filter removes the mesh's jitter (1.8x -> 1.58x) while the lips follow B's raw
    points (a stream sets A's lip gap from them)."""

    min_presence: float = 0.5
    redetect_every: int = 50
    detect_stages: tuple[str, ...] = ("hog",)
    pose_cutoff: float | None = None
    pose_beta: float = 0.6
    shape_cutoff: float = 6.0
    shape_beta: float = 2.0

    def __post_init__(self) -> None:
        if not 0.0 < self.min_presence < 1.0:
            raise ValueError(f"min_presence must be in (0, 1), got {self.min_presence}")
        if self.redetect_every < 0:
            raise ValueError(f"redetect_every must be >= 0, got {self.redetect_every}")
        if not self.detect_stages:
            raise ValueError("detect_stages must name at least one stage")
        for name in ("pose_cutoff", "shape_cutoff"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 Hz, got {value}")
        for name in ("pose_beta", "shape_beta"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


def _pose(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((cx, cy, log scale, angle), the shape in the face's own frame)."""
    centre = points.mean(axis=0)
    left, right = points[EYE_OUTER[0]], points[EYE_OUTER[1]]
    angle = math.atan2(right[1] - left[1], right[0] - left[0])
    offsets = points - centre
    scale = float(np.sqrt((offsets**2).sum(axis=1).mean()))
    cos, sin = math.cos(-angle), math.sin(-angle)
    level = offsets @ np.array([[cos, sin], [-sin, cos]])
    return np.array([centre[0], centre[1], math.log(scale), angle]), level / scale


def _points(pose: np.ndarray, shape: np.ndarray) -> np.ndarray:
    cx, cy, log_scale, angle = pose
    cos, sin = math.cos(angle), math.sin(angle)
    return shape * math.exp(log_scale) @ np.array([[cos, sin], [-sin, cos]]) + (cx, cy)


@dataclass
class Track:
    """One followed face: ``raw`` the network's points of the last frame, ``mesh`` the smoothed
    mesh, ``face`` built from it, ``age`` frames since the track started."""

    raw: Mesh
    mesh: Mesh
    face: Face
    settings: TrackSettings
    age: int = 0
    _pose_filter: OneEuroFilter | None = field(default=None, repr=False)
    _shape_filter: OneEuroFilter | None = field(default=None, repr=False)

    @classmethod
    def start(cls, raw: Mesh, image_shape, settings: TrackSettings) -> Track:
        track = cls(raw, raw, face_from_mesh(raw, image_shape), settings)
        if settings.pose_cutoff is not None:
            track._pose_filter = OneEuroFilter(settings.pose_cutoff, settings.pose_beta)
        track._shape_filter = OneEuroFilter(settings.shape_cutoff, settings.shape_beta)
        track._smooth(raw, 0.0, image_shape)
        return track

    def _smooth(self, raw: Mesh, dt: float, image_shape) -> None:
        pose, shape = _pose(raw.points)
        span = raw.eye_span
        # the centre is filtered in eye spans, so one cutoff suits every face size
        smooth = pose
        if self._pose_filter is not None:
            scaled = pose.copy()
            scaled[:2] /= max(span, 1.0)
            if self._pose_filter._x is not None:  # keep the angle continuous across +-pi
                last = self._pose_filter._x[3]
                scaled[3] = last + math.remainder(scaled[3] - last, 2 * math.pi)
            smooth = self._pose_filter(scaled, dt)
            smooth[:2] *= max(span, 1.0)
        points = _points(smooth, self._shape_filter(shape, dt))
        self.raw = raw
        self.mesh = Mesh(points, raw.depth, raw.presence)
        self.face = face_from_mesh(self.mesh, image_shape, detector="facemesh-track")

    def follow(self, rgb: np.ndarray, dt: float) -> bool:
        """Move to this frame; False (and the track unchanged) when the face is lost."""
        raw = track_mesh(rgb, self.raw.points)
        if raw.presence < self.settings.min_presence:
            return False
        self._smooth(raw, dt, rgb.shape)
        self.age += 1
        return True


def _overlaps(face: Face, track: Track) -> bool:
    """True when the detector's face is the tracked one (its eye midpoint inside the track's
    face box)."""
    x, y = face.eye_centre
    x0, y0, x1, y1 = track.face.box
    return x0 <= x < x1 and y0 <= y < y1


class FaceTracker:
    """B's faces through a stream; ``update(frame, t)`` returns the tracks of this frame.

    ``select``: "largest" follows the largest face, "all" every face found (at most
    ``max_faces``). Counters: ``detections`` (detector passes), ``lost`` (tracks lost)."""

    def __init__(self, settings: TrackSettings | None = None, select: str = "largest",
                 max_faces: int = 8):  # fmt: skip
        if select not in ("largest", "all"):
            raise ValueError(f"select must be largest or all, got {select!r}")
        self.settings = settings or TrackSettings()
        self.select, self.max_faces = select, int(max_faces)
        self.tracks: list[Track] = []
        self.frames = self.detections = self.lost = 0
        self._last_t: float | None = None

    def _detect(self, rgb: np.ndarray) -> list[Face]:
        self.detections += 1
        faces = find_faces(rgb, self.settings.detect_stages, small=self.select == "all")
        faces.sort(key=lambda f: -f.eye_distance)
        return faces[: 1 if self.select == "largest" else self.max_faces]

    def update(self, rgb: np.ndarray, t: float) -> list[Track]:
        """The tracks in this frame (``t``: its time in seconds; only differences matter)."""
        rgb = np.ascontiguousarray(rgb)
        dt = 0.0 if self._last_t is None else max(0.0, t - self._last_t)
        self._last_t = t
        kept = [track for track in self.tracks if track.follow(rgb, dt)]
        self.lost += len(self.tracks) - len(kept)
        self.tracks = kept
        every = self.settings.redetect_every
        due = not self.tracks or (every > 0 and self.frames % every == every - 1)
        self.frames += 1
        if due:
            for face in self._detect(rgb):
                if any(_overlaps(face, track) for track in self.tracks):
                    continue
                if self.select == "largest" and self.tracks:
                    if face.eye_distance <= self.tracks[0].face.eye_distance * 1.2:
                        continue
                    self.tracks = []  # a clearly larger face came into view: follow it
                raw = face_mesh(rgb, face)
                if raw.presence >= self.settings.min_presence:
                    self.tracks.append(Track.start(raw, rgb.shape, self.settings))
        return list(self.tracks)
