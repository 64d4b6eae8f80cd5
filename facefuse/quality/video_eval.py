"""How good a fused video is, frame by frame against its input (``facefuse video-eval``).

Measures, each on the output and the input B of the same frames:

* **identity**: dlib's descriptor of the fused face against A's (distance, < 0.6 the same
  person) and against B's own in that frame; "nearer A" when d(A) < d(B) (every
  ``identity_every``-th frame: a descriptor costs ~50 ms);
* **mouth**: FaceMesh's inner-lip gap of B and of the output over time, and their correlation
  (the lips follow B when it is near 1);
* **stability**: the flow-warping error (Lai et al. 2018's temporal warping error): dense
  optical flow of B between consecutive frames (Farneback), the previous frame warped onto the
  next by it, the mean absolute difference inside the face box; the output's error over B's own
  (1 = as steady as the input, > 1 flicker or jitter the input does not have);
* **seams** (a clip fused in segments over several streams): the same ratio on the frame pairs
  that straddle a segment boundary only (``seams``: the first frame index of each segment after
  the first), where a visible jump would show;
* **faceless frames**: where B shows no face, the output's PSNR against B (untouched: the cap).

Nothing here runs in the serving path; dlib's 68-point predictor is evaluation only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np

from facefuse.quality.fusion_eval import PSNR_CAP_DB, FaceMeter, descriptor_distance, masked_psnr


def flow_warp_error(
    previous: np.ndarray, current: np.ndarray, previous_out: np.ndarray,
    current_out: np.ndarray, box: tuple[int, int, int, int],
) -> tuple[float, float]:  # fmt: skip
    """(input's, output's) mean absolute warping error in ``box`` (8-bit units): both
    previous frames carried onto the current one by B's own optical flow."""
    grey = [cv2.cvtColor(np.ascontiguousarray(f), cv2.COLOR_RGB2GRAY) for f in (current, previous)]
    flow = cv2.calcOpticalFlowFarneback(grey[0], grey[1], None, 0.5, 3, 15, 3, 5, 1.2, 0)
    height, width = grey[0].shape
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    map_x, map_y = xs + flow[..., 0], ys + flow[..., 1]
    x0, y0, x1, y1 = (int(v) for v in box)
    x0, y0, x1, y1 = max(0, x0), max(0, y0), min(width, x1), min(height, y1)
    errors = []
    for before, now in ((previous, current), (previous_out, current_out)):
        warped = cv2.remap(np.ascontiguousarray(before), map_x, map_y, cv2.INTER_LINEAR,
                           borderMode=cv2.BORDER_REPLICATE)  # fmt: skip
        diff = np.abs(warped[y0:y1, x0:x1].astype(np.float32) - now[y0:y1, x0:x1])
        errors.append(float(diff.mean()) if diff.size else 0.0)
    return errors[0], errors[1]


def correlation(a, b) -> float | None:
    """Pearson correlation of two series over the frames both measured (None: too few or flat)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or a[ok].std() < 1e-9 or b[ok].std() < 1e-9:
        return None
    return float(np.corrcoef(a[ok], b[ok])[0, 1])


@dataclass
class ClipMeter:
    """Accumulates one clip's figures frame by frame (:meth:`add`), then :meth:`summary`."""

    source_descriptor: np.ndarray
    identity_every: int = 5
    meter: FaceMeter = field(default_factory=FaceMeter)
    gaps_in: list = field(default_factory=list)
    gaps_out: list = field(default_factory=list)
    warp_in: list = field(default_factory=list)
    warp_out: list = field(default_factory=list)
    warp_frames: list = field(default_factory=list)  # the later frame of each measured pair
    seams: tuple = ()
    distances: list = field(default_factory=list)  # (d(A), d(B))
    faceless_psnr: list = field(default_factory=list)
    frames: int = 0
    with_face: int = 0
    found: int = 0
    _previous: tuple | None = None
    _tracker: object = None
    _tracker_out: object = None

    def __post_init__(self) -> None:
        from facefuse.face.track import FaceTracker, TrackSettings

        raw = TrackSettings(redetect_every=10, pose_cutoff=1000.0, shape_cutoff=1000.0)
        self._tracker = FaceTracker(raw)
        self._tracker_out = FaceTracker(raw)

    def add(self, frame_in: np.ndarray, frame_out: np.ndarray, t: float, fused: bool) -> None:
        """One frame of B and its output; ``fused``: the service said it fused a face here."""
        from facefuse.face.lips import lip_gap

        tracks = self._tracker.update(frame_in, t)
        tracks_out = self._tracker_out.update(frame_out, t)
        box = tracks[0].face.box if tracks else None
        self.gaps_in.append(lip_gap(tracks[0].raw.points) if tracks else np.nan)
        self.gaps_out.append(lip_gap(tracks_out[0].raw.points) if tracks_out else np.nan)
        if tracks:
            self.with_face += 1
            self.found += int(fused)
        else:
            everywhere = np.ones(frame_in.shape[:2], bool)
            self.faceless_psnr.append(masked_psnr(frame_in, frame_out, everywhere))
        if box is not None and self._previous is not None:
            previous_in, previous_out = self._previous
            e_in, e_out = flow_warp_error(previous_in, frame_in, previous_out, frame_out, box)
            self.warp_in.append(e_in)
            self.warp_out.append(e_out)
            self.warp_frames.append(self.frames)
        if box is not None and self.frames % self.identity_every == 0:
            faces = self.meter.detect(frame_out)
            if faces:
                fused_face = self.meter.measure(frame_out, faces[0])
                target_face = self.meter.measure(frame_in, faces[0])
                self.distances.append(
                    (
                        descriptor_distance(fused_face.descriptor, self.source_descriptor),
                        descriptor_distance(fused_face.descriptor, target_face.descriptor),
                    )
                )
        self._previous = (frame_in, frame_out)
        self.frames += 1

    def summary(self) -> dict:
        d = np.asarray(self.distances, np.float64).reshape(-1, 2)
        warp_in, warp_out = float(np.sum(self.warp_in)), float(np.sum(self.warp_out))
        return {
            "frames": self.frames,
            "frames_with_face": self.with_face,
            "face_found_share": round(self.found / self.with_face, 4) if self.with_face else None,
            "distance_a_median": round(float(np.median(d[:, 0])), 4) if len(d) else None,
            "nearer_a_share": round(float(np.mean(d[:, 0] < d[:, 1])), 4) if len(d) else None,
            "identity_frames": len(d),
            "mouth_correlation": _round(correlation(self.gaps_in, self.gaps_out)),
            "stability_ratio": round(warp_out / warp_in, 4) if warp_in > 0 else None,
            "warp_error_input": round(warp_in / max(len(self.warp_in), 1), 3),
            "warp_error_output": round(warp_out / max(len(self.warp_out), 1), 3),
            "faceless_frames": len(self.faceless_psnr),
            "faceless_psnr_min_db": round(min(self.faceless_psnr), 2)
            if self.faceless_psnr
            else None,
            "psnr_cap_db": PSNR_CAP_DB,
            **self._seam_summary(),
        }

    def _seam_summary(self) -> dict:
        if not self.seams:
            return {}
        seams = set(self.seams)
        at = [i for i, frame in enumerate(self.warp_frames) if frame in seams]
        warp_in = float(sum(self.warp_in[i] for i in at))
        warp_out = float(sum(self.warp_out[i] for i in at))
        return {
            "seams": list(self.seams),
            "seams_measured": len(at),
            "seam_stability_ratio": round(warp_out / warp_in, 4) if warp_in > 0 else None,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def strip(frames_in: list[np.ndarray], frames_out: list[np.ndarray], count: int = 6,
          height: int = 180) -> np.ndarray:  # fmt: skip
    """Input frames over output frames, ``count`` evenly spaced, each ``height`` tall."""
    picks = np.linspace(0, len(frames_out) - 1, min(count, len(frames_out))).round().astype(int)
    rows = []
    for frames in (frames_in, frames_out):
        tiles = []
        for i in picks:
            h, w = frames[i].shape[:2]
            tiles.append(cv2.resize(frames[i], (round(w * height / h), height)))
        rows.append(np.hstack(tiles))
    return np.vstack(rows)
