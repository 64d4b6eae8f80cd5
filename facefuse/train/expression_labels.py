"""Smiling / neutral labels for every training photo, from the shipped expression model.

    python -m facefuse.train.expression_labels --data ../shared/data \\
        --heldout-from facefuse/models/faces/training.json \\
        --out facefuse/train/labels/expressions.csv

Each photo goes through the served detector and FaceMesh (Apache-2.0), and its ``smile``
coefficient (:class:`facefuse.face.expression.ExpressionModel`, 1.0 = the London training
people's average smile) is written beside a label: ``smiling`` at or above
:data:`SMILING_FROM`, ``neutral`` at or below :data:`NEUTRAL_UP_TO`, empty in between (the
caption then says nothing of expression). The two thresholds are fixed here and checked on the
held-out London people, whose folder says the truth; the accuracy is printed and written to
the CSV's companion ``.json``. Deterministic: same photos, same file.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from facefuse.face import facemesh as fm
from facefuse.face.detect import find_face
from facefuse.face.expression import default_model
from facefuse.face.imageio import decode_image
from facefuse.train.data import LONDON, collect_photos

SMILING_FROM = 0.7
NEUTRAL_UP_TO = 0.1
FIELDS = ("dataset", "id", "smile", "label")


def label(smile: float | None) -> str:
    """``smiling``, ``neutral`` or "" (no face, or between the two thresholds)."""
    if smile is None:
        return ""
    if smile >= SMILING_FROM:
        return "smiling"
    return "neutral" if smile <= NEUTRAL_UP_TO else ""


def smile_of(path: Path) -> float | None:
    """The photo's smile coefficient, or None when no face is found."""
    rgb = decode_image(path.read_bytes(), str(path))
    face = find_face(rgb)
    if face is None:
        return None
    return float(default_model().coefficients(fm.face_mesh(rgb, face).points)[0])


def rows(root: Path) -> list[dict]:
    """One row per photo :func:`~facefuse.train.data.collect_photos` finds, held-out London
    people included; the London set as ``faces-london/neutral`` / ``.../smiling``."""
    out = []
    for photo in collect_photos(root, heldout=(), labels={}):
        dataset = f"{LONDON}/{photo.kind}" if photo.dataset == LONDON else photo.dataset
        smile = smile_of(photo.path)
        shown = "" if smile is None else f"{smile:.3f}"
        out.append({"dataset": dataset, "id": photo.person, "smile": shown, "label": label(smile)})
    return out


def heldout_accuracy(table: list[dict], heldout: set[str]) -> dict:
    """On held-out London photos: the share labelled right, and the share left unlabelled."""
    seen = [r for r in table if r["dataset"].startswith(LONDON) and r["id"] in heldout]
    truth = [r["dataset"].split("/")[1] for r in seen]
    labelled = [(r["label"], t) for r, t in zip(seen, truth, strict=True) if r["label"]]
    right = sum(got == want for got, want in labelled)
    return {
        "photos": len(seen),
        "labelled": len(labelled),
        "right_of_labelled": round(right / max(len(labelled), 1), 4),
        "unlabelled": round(1 - len(labelled) / max(len(seen), 1), 4),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--heldout-from", type=Path, required=True, help="a model's training.json")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        heldout = set(json.loads(args.heldout_from.read_text())["heldout_london_ids"])
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"--heldout-from {args.heldout_from}: expected a model's training.json "
                     f"with heldout_london_ids ({exc!r})")  # fmt: skip
    if not args.data.is_dir():
        parser.error(f"--data {args.data}: not a directory")
    table = rows(args.data)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_suffix(".csv.partial")
    with partial.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, FIELDS)
        writer.writeheader()
        writer.writerows(table)
    partial.replace(args.out)
    summary = {
        "smiling_from": SMILING_FROM,
        "neutral_up_to": NEUTRAL_UP_TO,
        "heldout_london": heldout_accuracy(table, heldout),
        "counts": {
            d: {
                k: sum(r["dataset"] == d and r["label"] == k for r in table)
                for k in ("smiling", "neutral", "")
            }
            for d in sorted({r["dataset"] for r in table})
        },
    }
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    json.dump(summary, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
