"""Fit the expression basis (:mod:`facefuse.face.expression`) on the London set's training people.

    python -m facefuse.face.expression_fit --london ../shared/data/faces-london \\
        --heldout-from facefuse/models/faces/training.json \\
        --out facefuse/face/data/expression_basis.npz

Every person with both a neutral and a smiling photo whose id is not held out (the ``faces``
model's ``heldout_london_ids``) contributes; each photo goes through the served detector and
:func:`~facefuse.face.facemesh.face_mesh`. Deterministic: same photos, same file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import cv2
import numpy as np

from facefuse.face import expression as ex
from facefuse.face import facemesh as fm
from facefuse.face.detect import find_face
from facefuse.face.geometry import apply, similarity_transform

EXTRA_MODES = 2


def london_meshes(root: Path, ids: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """id -> (neutral points, smiling points) for every id whose two photos have a face."""
    meshes = {}
    for person in ids:
        pair = []
        for kind in ("neutral", "smiling"):
            bgr = cv2.imread(str(root / kind / f"{person}.jpg"))
            rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            face = find_face(rgb)
            if face is None:
                break
            pair.append(fm.face_mesh(rgb, face).points)
        if len(pair) == 2:
            meshes[person] = (pair[0], pair[1])
    return meshes


def mirror_index(template: np.ndarray) -> np.ndarray:
    """For each point, the point nearest its mirror image across the face's vertical axis."""
    axis_x = template[list(ex.RIGID[4:])][:, 0].mean()  # the nose bridge
    mirrored = template.copy()
    mirrored[:, 0] = 2 * axis_x - mirrored[:, 0]
    distances = np.linalg.norm(template[None, :, :] - mirrored[:, None, :], axis=2)
    return distances.argmin(axis=1)


def symmetrise(vector: np.ndarray, mirror: np.ndarray) -> np.ndarray:
    v = vector.reshape(fm.COUNT, 2)
    flipped = v[mirror] * np.array([-1.0, 1.0])
    return ((v + flipped) / 2).reshape(-1)


def rigid_free(template: np.ndarray, mode: np.ndarray) -> np.ndarray:
    """``mode`` less the similarity motion it gives the rigid points, so that moving a face
    along it leaves its normalisation (and so its other coefficients) unchanged."""
    moved = template + mode.reshape(fm.COUNT, 2)
    rigid = list(ex.RIGID)
    aligned = apply(similarity_transform(moved[rigid], template[rigid]), moved)
    return (aligned - template).reshape(-1)


def fit(meshes: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple:
    """(template, identity modes, expression modes, meta) from id -> (neutral, smiling)."""
    people = sorted(meshes)
    # template: eye-span frame first, then twice refined on the rigid points
    level = []
    for person in people:
        p = meshes[person][0]
        matrix = similarity_transform(p[list(fm.EYE_OUTER)], np.array([[-0.5, 0.0], [0.5, 0.0]]))
        level.append(apply(matrix, p))
    template = np.mean(level, axis=0)
    rigid = list(ex.RIGID)
    for _ in range(2):
        template = np.mean(
            [
                apply(similarity_transform(meshes[q][0][rigid], template[rigid]), meshes[q][0])
                for q in people
            ],
            axis=0,
        )
    model = ex.ExpressionModel(template, np.zeros((0, template.size)), np.zeros((0, 0)), {})
    neutral = np.array([model.normalise(meshes[q][0])[0] for q in people])
    smiling = np.array([model.normalise(meshes[q][1])[0] for q in people])
    mirror = mirror_index(template)
    displacement = (smiling - neutral).reshape(len(people), -1)
    smile = symmetrise(displacement.mean(axis=0), mirror)
    widen = np.array([ex.mouth_width(s) - ex.mouth_width(n) for n, s in zip(neutral, smiling)])
    part = np.array([ex.lip_gap(s) - ex.lip_gap(n) for n, s in zip(neutral, smiling)])
    per_unit = np.linalg.lstsq(np.stack([widen, part], 1), displacement, rcond=None)[0]
    mouth_open = symmetrise(per_unit[1], mirror).reshape(fm.COUNT, 2)
    eye_line = template[list(fm.EYE_OUTER)][:, 1].mean()
    nose_y = template[fm.NOSE_TIP, 1]
    fade = np.clip((template[:, 1] - eye_line) / (nose_y - eye_line), 0.0, 1.0)
    mouth_open = (mouth_open * fade[:, None]).reshape(-1)
    mouth_open *= ex.OPEN_GAP / (ex.lip_gap(template + mouth_open.reshape(-1, 2)) -
                                 ex.lip_gap(template))  # fmt: skip
    base = np.stack([smile, mouth_open])
    coeffs = np.linalg.lstsq(base.T, displacement.T, rcond=None)[0].T
    rest = displacement - coeffs @ base
    extra = np.linalg.svd(rest, full_matrices=False)[2][:EXTRA_MODES]
    scale = np.sqrt(np.mean((rest @ extra.T) ** 2, axis=0))  # 1.0 = one s.d. of the pairs
    extra = extra * scale[:, None]
    expression = np.array([rigid_free(template, v) for v in np.vstack([base, extra])])
    centred = (neutral - template).reshape(len(people), -1)
    identity = np.linalg.svd(centred, full_matrices=False)[2][: ex.IDENTITY_MODES]
    fitted = ex.ExpressionModel(template, identity, expression, {})
    neutral_coefficients = np.array([fitted.coefficients(meshes[q][0]) for q in people])
    meta = {
        "people": people,
        # how far the training people's neutral photos read from 0 (median of |c|
        # per mode): coefficients within it are face shape, not expression
        "neutral_band": [
            round(float(v), 4) for v in np.percentile(np.abs(neutral_coefficients), 50, axis=0)
        ],
        "source": "Face Research Lab London Set, DeBruine & Jones 2017, CC BY 4.0 "
        "(doi 10.6084/m9.figshare.5047666.v5); landmarks: MediaPipe FaceMesh",
        "modes": list(ex.MODES),
        "identity_modes": ex.IDENTITY_MODES,
        "open_gap": ex.OPEN_GAP,
        "pairs_median_widen": round(float(np.median(widen)), 4),
        "pairs_median_part": round(float(np.median(part)), 4),
    }
    return template, identity, expression, meta


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fit the expression basis")
    parser.add_argument("--london", type=Path, required=True)
    parser.add_argument("--heldout-from", type=Path, required=True,
                        help="JSON with heldout_london_ids (never fitted on)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ex.BASIS_FILE)
    args = parser.parse_args(argv)
    heldout = set(json.loads(args.heldout_from.read_text())["heldout_london_ids"])
    ids = sorted(p.stem for p in (args.london / "neutral").glob("*.jpg"))
    ids = [i for i in ids if i not in heldout and (args.london / "smiling" / f"{i}.jpg").is_file()]
    meshes = london_meshes(args.london, ids)
    template, identity, expression, meta = fit(meshes)
    meta["heldout_excluded"] = sorted(heldout)
    ex.save(args.out, template, identity, expression, meta)
    print(f"{args.out}: {len(meshes)} people, modes {list(ex.MODES)}, "
          f"{args.out.stat().st_size} bytes")  # fmt: skip


if __name__ == "__main__":
    main()
