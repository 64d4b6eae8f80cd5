"""Offline probe of the expression route without diffusion, on held-out London people.

    python -m facefuse.quality.expression_probe --london ../shared/data/faces-london \\
        --heldout-from facefuse/models/faces/training.json --seed 1

For each held-out person A (paired with another held-out person B, drawn with ``--seed``):
A's FaceMesh points are moved by :meth:`~facefuse.face.expression.ExpressionModel.retarget`
to the wanted expression and A's own photo is warped there (:func:`~facefuse.face.warp.
piecewise_affine`); no diffusion, no compositing. Measured with dlib's 68 points (evaluation
only, :class:`~facefuse.quality.fusion_eval.FaceMeter`): the share of A's own smile reached
(mouth-corner distance over outer-eye span, and the corners' rise over the lips' middle, each
as (output - A neutral) / (A smiling - A neutral)) and the descriptor distance to A's neutral
and smiling photos.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import cv2
import numpy as np

from facefuse.face import expression as ex
from facefuse.face.detect import find_face
from facefuse.face.facemesh import face_mesh
from facefuse.face.warp import piecewise_affine
from facefuse.quality.fusion_eval import FaceMeter, descriptor_distance


def width68(p: np.ndarray) -> float:
    return float(np.linalg.norm(p[54] - p[48]) / np.linalg.norm(p[45] - p[36]))


def rise68(p: np.ndarray) -> float:
    left, right = p[36], p[45]
    span = float(np.linalg.norm(right - left))
    along = (right - left) / span
    down = np.array([-along[1], along[0]])
    return float(((p[62] + p[66]) / 2 - (p[48] + p[54]) / 2) @ down / span)


def share(value: float, neutral: float, smiling: float) -> float:
    """Where ``value`` lies between a person's neutral (0) and smiling (1) measure."""
    span = smiling - neutral
    return float((value - neutral) / span) if abs(span) > 1e-6 else float("nan")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="expression warp probe (no diffusion)")
    parser.add_argument("--london", type=Path, required=True)
    parser.add_argument("--heldout-from", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="JSON of the figures")
    args = parser.parse_args(argv)
    ids = json.loads(args.heldout_from.read_text())["heldout_london_ids"]
    model = ex.default_model()
    meter = FaceMeter()
    photos, meshes, records = {}, {}, {}
    for person in ids:
        for kind in ("neutral", "smiling"):
            bgr = cv2.imread(str(args.london / kind / f"{person}.jpg"))
            rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            photos[kind, person] = rgb
            meshes[kind, person] = face_mesh(rgb, find_face(rgb)).points
            records[kind, person] = meter.main_face(rgb)
    coeffs = {key: model.coefficients(points) for key, points in meshes.items()}
    rng = random.Random(args.seed)  # noqa: S311 - pairing, not security

    def run(kind: str, person: str, wanted: np.ndarray) -> dict:
        points = meshes[kind, person]
        moved = model.retarget(points, coeffs[kind, person], wanted)
        face = meter.main_face(piecewise_affine(photos[kind, person], points, moved))
        neutral, smiling = records["neutral", person], records["smiling", person]
        return {
            "smile_share": share(
                width68(face.points), width68(neutral.points), width68(smiling.points)
            ),
            "rise_share": share(
                rise68(face.points), rise68(neutral.points), rise68(smiling.points)
            ),
            "d_neutral": descriptor_distance(face.descriptor, neutral.descriptor),
            "d_smiling": descriptor_distance(face.descriptor, smiling.descriptor),
        }

    cases: dict[str, list[dict]] = {}
    for person in ids:
        other = rng.choice([q for q in ids if q != person])
        cases.setdefault("A neutral, B smiling", []).append(
            run("neutral", person, coeffs["smiling", other])
        )
        cases.setdefault("A smiling, B neutral", []).append(
            run("smiling", person, coeffs["neutral", other])
        )
        for level in (0.5, 1.0, 1.5):
            wanted = coeffs["neutral", other].copy()
            wanted[0] = max(wanted[0], level)
            cases.setdefault(f"smile {level} on neutral B", []).append(
                run("neutral", person, wanted)
            )
        zero = np.zeros(len(ex.MODES))
        cases.setdefault("neutral on smiling B (A smiling)", []).append(
            run("smiling", person, zero)
        )
    summary = {
        "coefficients": {
            f"heldout {kind} smile median": float(np.median([coeffs[kind, q][0] for q in ids]))
            for kind in ("neutral", "smiling")
        }
        | {
            "pairs ordered (smiling > neutral)": float(
                np.mean([coeffs["smiling", q][0] > coeffs["neutral", q][0] for q in ids])
            ),
        },
        "cases": {},
    }
    for name, rows in cases.items():
        smile = np.array([r["smile_share"] for r in rows])
        summary["cases"][name] = {
            "smile_share_median": round(float(np.nanmedian(smile)), 3),
            "smile_share_at_least_0.4": round(float(np.mean(smile >= 0.4)), 3),
            "rise_share_median": round(float(np.nanmedian([r["rise_share"] for r in rows])), 3),
            "d_neutral_median": round(float(np.median([r["d_neutral"] for r in rows])), 3),
            "d_smiling_median": round(float(np.median([r["d_smiling"] for r in rows])), 3),
        }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
