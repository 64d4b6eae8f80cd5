"""Training crops: the faces of a data folder, cut exactly as the fusion pipeline cuts B.

Each photo is decoded as the service decodes it, its face is found by the project's detector
cascade and cropped with the pipeline's own face ellipse and square box
(:func:`facefuse.face.geometry.crop_box`), so the UNet trains on what it is later handed.
Augmentation (flip, small scale / rotation / shift, colour jitter) is applied to the photo
through the crop's affine map, so a shifted crop shows real pixels, not padding.

Captions say what is known of each photo (:func:`caption`): the London set's ``neutral/`` and
``smiling/`` folders, "black and white" for the congress portraits and the grey copies, the
expression of the other photos where the landmark smile classifier is confident
(``labels/expressions.csv``, :mod:`facefuse.train.expression_labels`), and the person ("young
woman", "old man", ``labels/people.csv``, labelled by looking at each colour photo). Generic
portrait words ("portrait photo", "headshot") are added to every set at one rate, so that they
call up no set of their own. Held-out London people are never read for training.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from facefuse.core.errors import InvalidInput
from facefuse.face import geometry
from facefuse.face.detect import find_face
from facefuse.face.evaluate import image_files
from facefuse.face.imageio import PixelError, decode_image

# Caption kind -> phrasings. Short, like the prompt optimizer's output ("smiling",
# "keep neutral expression", "smiling glasses"), so the served prompts are ones it was trained on.
CAPTIONS = {
    "smiling": (
        "smiling",
        "smile",
        "big smile",
        "smiling face",
        "portrait smiling",
        "photo person smiling",
        "happy smiling",
    ),
    "neutral": (
        "neutral expression",
        "keep neutral expression",
        "serious",
        "neutral face",
        "portrait neutral expression",
        "calm face closed mouth",
    ),
    "bw": ("black and white photo", "black and white portrait", "monochrome portrait photo"),
    "portrait": ("portrait photo", "portrait", "photo person", "face", "headshot"),
}
# The person words of labels/people.csv ("young woman", "old man", "man"); an age is only
# said with a gender.
GENDERS, AGES = ("man", "woman"), ("young", "old")
LABELS = Path(__file__).parent / "labels"

# Words users add that say nothing the photos show; appended at random so that the model keeps
# following the expression words when they appear ("make her smile, keep the hair" ->
# "smiling hair").
DISTRACTORS = (
    "glasses", "hair", "keep hair", "soft studio light", "detailed", "sharp", "natural light",
    "photo", "realistic", "keep glasses", "high quality",
)  # fmt: skip

# Generic words a user puts before any face prompt; added to captions of every set (not only
# the portraits set's), so that they do not call up one set's look.
GENERIC = ("portrait photo", "portrait", "headshot", "photo", "photo person", "face")

# Which caption kind each dataset folder carries, and its sampling weight per epoch (the
# London pairs are the only expression supervision, so they are drawn more often). GREY holds
# grey copies of the colour photos, captioned "bw" like the congress portraits.
LONDON, CONGRESS, PORTRAITS, GREY = "faces-london", "faces-congress", "faces", "grey"
SAMPLING_WEIGHT = {LONDON: 0.4, CONGRESS: 0.25, PORTRAITS: 0.2, GREY: 0.15}


@dataclass(frozen=True)
class Photo:
    """One training photo: its file, dataset, person and caption kind."""

    path: Path
    dataset: str
    person: str
    kind: str
    expression: str = ""  # "smiling" / "neutral" where known (a London photo: its folder)
    gender: str = ""
    age: str = ""

    @property
    def labels(self) -> str:
        """``expression|gender|age``, as the latent cache stores it."""
        return f"{self.expression}|{self.gender}|{self.age}"


def london_people(root: Path) -> list[str]:
    """IDs present in both ``neutral/`` and ``smiling/`` of the London set, sorted."""
    folder = root / LONDON
    if not ((folder / "neutral").is_dir() and (folder / "smiling").is_dir()):
        return []
    neutral = {p.stem for p in image_files(folder / "neutral")}
    smiling = {p.stem for p in image_files(folder / "smiling")}
    return sorted(neutral & smiling)


def split_people(people: list[str], heldout: int, seed: int) -> tuple[list[str], list[str]]:
    """(train, held-out) people: a seeded choice of ``heldout`` of them, both sorted."""
    if heldout and heldout >= len(people):
        raise InvalidInput("--heldout", f"must be below the {len(people)} London people")
    rng = np.random.default_rng(seed)
    chosen = set(rng.choice(people, size=heldout, replace=False).tolist())
    return sorted(set(people) - chosen), sorted(chosen)


def read_labels(folder: Path = LABELS) -> dict[tuple[str, str], dict[str, str]]:
    """(dataset, id) -> {"expression", "gender", "age"} from the label files of ``folder``
    (missing files: no labels). A value outside the known words names the file and row."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    allowed = {"gender": (*GENDERS, "unknown"), "age": (*AGES, "unknown"),
               "label": ("smiling", "neutral", "")}  # fmt: skip
    for name, columns in (("people.csv", ("gender", "age")), ("expressions.csv", ("label",))):
        path = folder / name
        if not path.is_file():
            continue
        with path.open(newline="") as handle:
            for line, row in enumerate(csv.DictReader(handle), start=2):
                for column in columns:
                    value = (row.get(column) or "").strip()
                    if value not in allowed[column]:
                        raise InvalidInput(
                            str(path),
                            f"line {line}: {column} must be one of "
                            f"{allowed[column]}, got {value!r}",
                        )
                    key = "expression" if column == "label" else column
                    entry = out.setdefault((row["dataset"], row["id"]), {})
                    entry[key] = "" if value == "unknown" else value
    return out


def collect_photos(
    root: str | Path, heldout: Iterable[str], labels: dict | None = None
) -> list[Photo]:
    """Every training photo under ``root`` (a folder laid out like ``../shared/data``), with
    ``labels`` (default: :func:`read_labels`) attached."""
    root = Path(root)
    labels = read_labels() if labels is None else labels
    if not root.is_dir():
        raise InvalidInput("--data", f"{root} is not a directory")
    skip = set(heldout)
    photos = []
    for person in london_people(root):
        if person in skip:
            continue
        who = labels.get((LONDON, person), {})
        for kind in ("neutral", "smiling"):
            path = root / LONDON / kind / f"{person}.jpg"
            photos += [Photo(path, LONDON, person, kind, kind, who.get("gender", ""),
                             who.get("age", ""))]  # fmt: skip
    for dataset, kind in ((CONGRESS, "bw"), (PORTRAITS, "portrait")):
        for path in image_files(root / dataset) if (root / dataset).is_dir() else []:
            known = labels.get((dataset, path.stem), {})
            photos += [Photo(path, dataset, path.stem, kind, known.get("expression", ""),
                             known.get("gender", ""), known.get("age", ""))]  # fmt: skip
    photos = [p for p in photos if p.path.is_file()]
    if not photos:
        raise InvalidInput(
            "--data", f"{root}: no photos found (expected {LONDON}/, {CONGRESS}/ or {PORTRAITS}/)"
        )
    return photos


@dataclass
class Cropped:
    """A photo decoded, with the 2x3 map from its pixels to the ``size`` crop of its face."""

    photo: Photo
    rgb: np.ndarray
    to_crop: np.ndarray


def locate(photo: Photo, size: int) -> Cropped | None:
    """Decode and find the face; None when no face is found. Unreadable files raise."""
    try:
        rgb = decode_image(photo.path.read_bytes(), str(photo.path))
    except (InvalidInput, PixelError, OSError) as exc:
        raise InvalidInput(str(photo.path), f"expected a readable photo ({exc})") from exc
    face = find_face(rgb)
    if face is None:
        return None
    ellipse = geometry.face_ellipse(face.left_eye, face.right_eye)
    box = geometry.crop_box(ellipse, rgb.shape)
    return Cropped(photo, rgb, geometry.box_to_square(box, size))


def crop(item: Cropped, size: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """The face crop, float32 [size, size, 3] in [0, 1]; augmented when ``rng`` is given."""
    matrix = item.to_crop
    flip = False
    if rng is not None:
        angle = rng.uniform(-8.0, 8.0)
        scale = rng.uniform(0.92, 1.08)
        shift = rng.uniform(-0.04, 0.04, size=2) * size
        centre = (size / 2 - 0.5, size / 2 - 0.5)
        jitter = cv2.getRotationMatrix2D(centre, angle, scale)
        jitter[:, 2] += shift
        matrix = geometry.compose(jitter, matrix)
        flip = bool(rng.random() < 0.5)
    shrink = math.sqrt(abs(np.linalg.det(item.to_crop[:, :2])))
    out = cv2.warpAffine(
        item.rgb,
        matrix,
        (size, size),
        flags=cv2.INTER_AREA if shrink < 1 else cv2.INTER_CUBIC,
        borderMode=cv2.BORDER_REPLICATE,
    ).astype(np.float32)
    out /= 255.0
    if flip:
        out = out[:, ::-1]
    if rng is not None:
        out = _jitter_colour(out, rng, grayscale=item.photo.kind == "bw")
    return np.ascontiguousarray(np.clip(out, 0.0, 1.0))


def _jitter_colour(rgb: np.ndarray, rng: np.random.Generator, grayscale: bool) -> np.ndarray:
    """Brightness, contrast and (for colour photos) saturation, each within +-10%."""
    out = rgb * rng.uniform(0.9, 1.1)
    mean = out.mean()
    out = (out - mean) * rng.uniform(0.9, 1.1) + mean
    if not grayscale:
        gray = out.mean(axis=2, keepdims=True)
        out = (out - gray) * rng.uniform(0.9, 1.1) + gray
    return out


def grey(rgb: np.ndarray) -> np.ndarray:
    """A colour crop as a black-and-white photo (Rec. 601 luma in all three channels)."""
    luma = rgb @ np.array([0.299, 0.587, 0.114], np.float32)
    return np.repeat(luma[..., None], 3, axis=2).astype(np.float32)


def caption(
    kind: str,
    rng: np.random.Generator,
    distractor_p: float = 0.3,
    generic_p: float = 0.0,
    labels: str = "||",
    part_p: float = 0.7,
) -> str:
    """A caption of a photo of ``kind`` with ``labels`` (``expression|gender|age``).

    Parts: the kind's phrasing (the expression for the London set, "black and white" for
    ``bw``; none for ``portrait``), each known label with probability ``part_p`` (the person
    as "young woman" or "woman"), in random order; then a generic word before it with
    probability ``generic_p`` and a distractor before or after with ``distractor_p``. A photo
    that would get no part gets its person, or a ``portrait`` phrasing when nothing is known.
    Parts are comma-separated, as the prompt optimizer writes them."""
    expression, gender, age = [*labels.split("|"), "", ""][:3]
    parts = [] if kind == "portrait" else [str(rng.choice(CAPTIONS[kind]))]
    if expression and kind not in ("smiling", "neutral") and rng.random() < part_p:
        parts.append(str(rng.choice(CAPTIONS[expression])))
    if gender:
        person = f"{age} {gender}" if age and rng.random() < part_p else gender
        if rng.random() < part_p or not parts:
            parts.append(person)
    if not parts:
        parts.append(str(rng.choice(CAPTIONS["portrait"])))
    order = rng.permutation(len(parts))
    text = ", ".join(parts[i] for i in order)
    if rng.random() < generic_p:
        text = f"{rng.choice(GENERIC)}, {text}"
    if rng.random() < distractor_p:
        word = str(rng.choice(DISTRACTORS))
        text = f"{word}, {text}" if rng.random() < 0.5 else f"{text}, {word}"
    return text
