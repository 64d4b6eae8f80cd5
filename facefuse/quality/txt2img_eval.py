"""``facefuse txt2img-eval``: does the served ``txt2img`` draw faces, and does its prompt steer it?

Every prompt is drawn at every seed (the same seeds across prompts, so a column of the sheet
differs only by its prompt) through the served model, with its served prompt template. The
measuring instruments are :class:`~facefuse.quality.fusion_eval.FaceMeter`'s dlib models
(evaluation only). Per sample:

* *face found*: dlib's HOG finds a face in the picture enlarged to :data:`DETECT_SIDE` px;
* *greyness*: mean over pixels and channels of |channel - the pixel's channel mean|, in 0..255
  (0 for a black-and-white photo; :data:`GREY_BELOW` counts as grey);
* *expression ratio*: mouth width over outer-eye span (68 points) where a face is found;
  a smile prompt is compared with a neutral one at the same seed;
* *nearest training photo*: dlib descriptor distance to the closest face of the training data
  (``--training-data``); below :data:`COPY_DISTANCE` a sample counts as a near-copy.

The measures are pure functions; :func:`evaluate` takes the generation call as a function.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from facefuse.core.errors import InvalidInput

DEFAULT_PROMPTS = (
    "portrait photo",
    "black and white photo",
    "smiling",
    "neutral expression",
    "photo of an old man",
    "headshot of a young woman",
)
DEFAULT_SEEDS = tuple(range(1, 9))
SMILE_PROMPT, NEUTRAL_PROMPT, GREY_PROMPT = "smiling", "neutral expression", "black and white photo"
DETECT_SIDE = 256
GREY_BELOW = 3.0
COPY_DISTANCE = 0.35


def greyness(rgb: np.ndarray) -> float:
    """Mean |channel - pixel mean| of an RGB uint8 image, 0..255 (0: black and white)."""
    pixels = np.asarray(rgb, dtype=np.float64)
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"greyness: need an RGB image, got shape {pixels.shape}")
    return float(np.abs(pixels - pixels.mean(axis=2, keepdims=True)).mean())


def enlarge(rgb: np.ndarray, side: int = DETECT_SIDE) -> np.ndarray:
    """``rgb`` scaled (cubic) so its longer side is ``side``; dlib's HOG misses 128 px faces."""
    import cv2

    height, width = rgb.shape[:2]
    scale = side / max(height, width)
    if scale <= 1.0:
        return rgb
    size = (round(width * scale), round(height * scale))
    return cv2.resize(rgb, size, interpolation=cv2.INTER_CUBIC)


def nearest_distance(descriptor: np.ndarray, bank: np.ndarray) -> float | None:
    """Distance from ``descriptor`` to its nearest row of ``bank`` (None for an empty bank)."""
    if bank is None or len(bank) == 0:
        return None
    return float(np.min(np.linalg.norm(bank - np.asarray(descriptor)[None], axis=1)))


def _share(flags: Sequence[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None


def summarize(samples: Sequence[dict], prompts: Sequence[str]) -> dict:
    """Per-prompt and overall figures of :func:`evaluate`'s sample records."""
    per_prompt = {}
    for prompt in prompts:
        rows = [s for s in samples if s["prompt"] == prompt]
        per_prompt[prompt] = {
            "samples": len(rows),
            "face_found": _share([s["face_found"] for s in rows]),
            "grey": _share([s["greyness"] < GREY_BELOW for s in rows]),
            "median_greyness": round(statistics.median(s["greyness"] for s in rows), 2)
            if rows
            else None,
        }
    found = [s["face_found"] for s in samples]
    distances = [s["nearest_training"] for s in samples if s.get("nearest_training") is not None]
    summary = {
        "samples": len(samples),
        "face_found": _share(found),
        "min_face_found_per_prompt": min(
            (v["face_found"] for v in per_prompt.values() if v["face_found"] is not None),
            default=None,
        ),
        "per_prompt": per_prompt,
        "near_copies": _share([d < COPY_DISTANCE for d in distances]),
        "median_nearest_training": round(statistics.median(distances), 4) if distances else None,
    }
    by_key = {(s["prompt"], s["seed"]): s for s in samples}
    gains = []
    for seed in sorted({s["seed"] for s in samples}):
        smile, neutral = by_key.get((SMILE_PROMPT, seed)), by_key.get((NEUTRAL_PROMPT, seed))
        if smile and neutral and smile.get("expression") and neutral.get("expression"):
            gains.append(smile["expression"] / neutral["expression"] - 1.0)
    summary["smile_vs_neutral"] = {
        "seeds_with_both_faces": len(gains),
        "wider": _share([g > 0 for g in gains]),
        "median_gain": round(statistics.median(gains), 4) if gains else None,
    }
    return summary


def evaluate(
    generate: Callable[[str, int], np.ndarray],
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    meter=None,
    bank: np.ndarray | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> tuple[dict, list[list[np.ndarray]]]:
    """Draw every prompt at every seed with ``generate(prompt, seed) -> RGB uint8``; returns
    (report dict, images as rows of prompts by columns of seeds)."""
    if not prompts or not seeds:
        raise InvalidInput("--prompts/--seeds", "need at least one prompt and one seed")
    from facefuse.quality.fusion_eval import FaceMeter

    meter = meter or FaceMeter()
    samples, rows = [], []
    for prompt in prompts:
        row = []
        for seed in seeds:
            rgb = generate(prompt, int(seed))
            row.append(rgb)
            big = enlarge(rgb)
            face = meter.main_face(big)
            record = {
                "prompt": prompt,
                "seed": int(seed),
                "face_found": face is not None,
                "greyness": round(greyness(rgb), 3),
            }
            if face is not None:
                record["expression"] = round(face.expression, 4)
                nearest = nearest_distance(face.descriptor, bank)
                if nearest is not None:
                    record["nearest_training"] = round(nearest, 4)
            samples.append(record)
        rows.append(row)
        found = sum(s["face_found"] for s in samples[-len(seeds) :])
        log(f"{prompt!r}: face found {found}/{len(seeds)}")
    return {"samples": samples, "summary": summarize(samples, prompts)}, rows


def training_bank(paths: Sequence[Path], meter=None, log=lambda line: None) -> np.ndarray:
    """dlib descriptors of the main face of every photo in ``paths`` (photos without one are
    skipped); [n, 128] float64."""
    from facefuse.face.imageio import decode_image
    from facefuse.quality.fusion_eval import FaceMeter

    meter = meter or FaceMeter()
    rows = []
    for index, path in enumerate(paths):
        rgb = decode_image(Path(path).read_bytes(), str(path))
        face = meter.main_face(enlarge(rgb))
        if face is not None:
            rows.append(face.descriptor)
        if index % 100 == 0:
            log(f"training descriptors: {index + 1}/{len(paths)}")
    return np.asarray(rows, dtype=np.float64).reshape(-1, 128)


def sheet(rows: Sequence[Sequence[np.ndarray]], prompts: Sequence[str], seeds: Sequence[int]):
    """Contact sheet: one row per prompt, one column per seed."""
    from facefuse.quality.fusion_eval import contact_sheet

    return contact_sheet(rows, list(prompts), [f"seed {s}" for s in seeds], cell=128)
