"""A linear expression model on FaceMesh points: measure an expression, move a face to another.

Shapes are normalised by a similarity transform onto the model's template over rigid points
(eye corners and the nose bridge, :data:`RIGID`), so one unit is the template's outer-eye span.
In that frame a face is ``template + identity @ I + expression @ E``: ``I`` holds the first
:data:`IDENTITY_MODES` principal modes of the training people's neutral shapes (they soak up
face shape so that it does not read as expression), ``E`` the expression modes, in order:

* ``smile``: the mean neutral -> smiling displacement of the training people's London pairs
  (mirror-symmetrised); 1.0 is an average smile of that set, 0 a neutral face;
* ``mouth_open``: the displacement per unit of lip parting (regressed on the same pairs jointly
  with the mouth widening, symmetrised, nothing above the eyes), scaled so 1.0 parts the lips by
  :data:`OPEN_GAP` eye spans;
* ``mode1``, ``mode2``: the first principal modes of what the two leave of the pairs'
  displacements (asymmetry, lip shape), so a target's expression carries over more fully.

:meth:`ExpressionModel.coefficients` solves for both sets at once (least squares) and returns
the expression part; :meth:`ExpressionModel.retarget` moves a face's points from its own
expression to another one, keeping its identity part. The fitted arrays live in
``data/expression_basis.npz`` (``facefuse.face.expression_fit`` writes it; derived from the
Face Research Lab London Set, DeBruine & Jones 2017, CC BY 4.0).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facefuse.core.errors import ModelLoadError
from facefuse.face import facemesh as fm
from facefuse.face.geometry import apply, similarity_transform

BASIS_FILE = Path(__file__).parent / "data" / "expression_basis.npz"
RIGID = (33, 133, 362, 263, 168, 6, 197, 195, 5, 4)
IDENTITY_MODES = 4
OPEN_GAP = 0.25  # lip parting of mouth_open 1.0, in outer-eye spans
MODES = ("smile", "mouth_open", "mode1", "mode2")


@dataclass(frozen=True)
class ExpressionModel:
    """``template`` (468, 2); ``identity`` (k, 936); ``expression`` (len(MODES), 936)."""

    template: np.ndarray
    identity: np.ndarray
    expression: np.ndarray
    meta: dict

    def normalise(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(points in the template frame, the 2x3 image -> template matrix)."""
        points = np.asarray(points, np.float64).reshape(fm.COUNT, 2)
        matrix = similarity_transform(points[list(RIGID)], self.template[list(RIGID)])
        return apply(matrix, points), matrix

    @functools.cached_property
    def _design(self) -> np.ndarray:
        return np.vstack([self.expression, self.identity]).T  # (936, modes + k)

    def coefficients(self, points: np.ndarray) -> np.ndarray:
        """The expression coefficients (``len(MODES)``) of a face's points (image pixels)."""
        normal, _ = self.normalise(points)
        residual = (normal - self.template).reshape(-1)
        solution = np.linalg.lstsq(self._design, residual, rcond=None)[0]
        return solution[: len(MODES)]

    def retarget(self, points: np.ndarray, own: np.ndarray, wanted: np.ndarray) -> np.ndarray:
        """``points`` (image pixels) moved from expression ``own`` to ``wanted``: the change is
        added in the template frame and mapped back, so the face's identity, pose and scale
        stay."""
        normal, matrix = self.normalise(points)
        delta = (np.asarray(wanted, np.float64) - np.asarray(own, np.float64)) @ self.expression
        moved = normal + delta.reshape(fm.COUNT, 2)
        inverse = np.vstack([matrix, [0.0, 0.0, 1.0]])
        return apply(np.linalg.inv(inverse)[:2], moved)

    @property
    def neutral_band(self) -> np.ndarray:
        """Per mode, how far the training people's neutral photos read from 0 (median |c|)."""
        return np.asarray(self.meta.get("neutral_band", [0.0] * len(MODES)), np.float64)

    def as_dict(self, coefficients: np.ndarray) -> dict[str, float]:
        return {name: round(float(v), 3) for name, v in zip(MODES, coefficients, strict=True)}


def save(path: Path, template, identity, expression, meta: dict) -> None:
    np.savez_compressed(
        path,
        template=np.asarray(template, np.float32),
        identity=np.asarray(identity, np.float32),
        expression=np.asarray(expression, np.float32),
        meta=np.array(json.dumps(meta, sort_keys=True)),
    )


def load(path: Path = BASIS_FILE) -> ExpressionModel:
    if not Path(path).is_file():
        raise ModelLoadError(f"{path} is missing (python -m facefuse.face.expression_fit)")
    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        return ExpressionModel(
            data["template"].astype(np.float64),
            data["identity"].astype(np.float64),
            data["expression"].astype(np.float64),
            meta,
        )


@functools.lru_cache(maxsize=1)
def default_model() -> ExpressionModel:
    """The shipped model (``data/expression_basis.npz``), loaded once per process."""
    return load(BASIS_FILE)


# ------------------------------------------------------------------ measures on mesh points


def mouth_width(points: np.ndarray) -> float:
    """Mouth-corner distance over outer-eye span."""
    p = np.asarray(points, np.float64)
    span = np.linalg.norm(p[fm.EYE_OUTER[1]] - p[fm.EYE_OUTER[0]])
    return float(np.linalg.norm(p[fm.MOUTH_CORNERS[1]] - p[fm.MOUTH_CORNERS[0]]) / span)


def _down(p: np.ndarray) -> tuple[np.ndarray, float]:
    left, right = p[fm.EYE_OUTER[0]], p[fm.EYE_OUTER[1]]
    span = float(np.linalg.norm(right - left))
    along = (right - left) / span
    return np.array([-along[1], along[0]]), span


def corner_rise(points: np.ndarray) -> float:
    """How far the mouth corners sit above the lips' middle, in outer-eye spans (grows with
    a smile)."""
    p = np.asarray(points, np.float64)
    down, span = _down(p)
    middle = (p[fm.LIP_INNER_MID[0]] + p[fm.LIP_INNER_MID[1]]) / 2
    corners = (p[fm.MOUTH_CORNERS[0]] + p[fm.MOUTH_CORNERS[1]]) / 2
    return float((middle - corners) @ down / span)


def lip_gap(points: np.ndarray) -> float:
    """Inner-lip parting in outer-eye spans."""
    p = np.asarray(points, np.float64)
    down, span = _down(p)
    return float((p[fm.LIP_INNER_MID[1]] - p[fm.LIP_INNER_MID[0]]) @ down / span)
