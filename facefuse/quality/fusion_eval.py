"""``facefuse fusion-eval``: what the served fusion does to identity, expression and the rest of B.

Every (A, B) pair of two folders (A and B different people: different file stems) is fused
through the served ``facefusion`` model twice, with "make them smile" and "keep a neutral
expression" (same pair, same seed), and also composited locally without diffusion
(:func:`~facefuse.face.fusion.prepare_fusion` + :func:`~facefuse.face.fusion.paste_back` of
``plan.composite``: the paste-only baseline, so the report shows what diffusion costs or adds).

The measuring instruments are dlib models shipped in ``face_recognition_models``, used here for
evaluation only (the 68-point predictor is trained on iBUG 300-W, whose licence excludes
commercial use; it must never enter the serving path, which uses HOG/MMOD and 5 points):

* HOG detector with one upsampling; the output's face counts as *found* when a detection
  overlaps B's original face box with IoU >= :data:`MIN_IOU`;
* the 128-d ResNet descriptor (dlib's same-person threshold is 0.6): distance output->A and
  output->B, taken on the found face, else on B's original face box;
* the 68-point shape predictor: mouth width / outer-eye span (points 48-54 over 36-45), the
  *expression ratio*, which grows when a face smiles;
* PSNR of B outside the face: over the pixels where the served paste's feathered mask (with
  the expression stage: A's face to its own outline), resized to B as paste_back does, is
  < 0.5 (the outer feather ramp included, so the figure is finite even for a perfect
  pipeline).

The measurement functions (:func:`box_iou`, :func:`expression_ratio`, :func:`outside_face`,
:func:`masked_psnr`, :func:`summarize`, :func:`contact_sheet`, ...) are pure; :func:`evaluate`
takes the fusion call as a function, so it runs against a server or a stand-in.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from facefuse.core.errors import InvalidInput
from facefuse.face.evaluate import IMAGE_SUFFIXES
from facefuse.quality.metrics import PSNR_CAP_DB

SMILE_INSTRUCTION = "make them smile"
NEUTRAL_INSTRUCTION = "keep a neutral expression"
MIN_IOU = 0.5
HOG_UPSAMPLE = 1
MOUTH_CORNERS = (48, 54)
OUTER_EYE_CORNERS = (36, 45)
SAME_PERSON_DISTANCE = 0.6  # dlib's threshold for the ResNet descriptor
LANDMARKS68_FILE = "shape_predictor_68_face_landmarks.dat"
DESCRIPTOR_FILE = "dlib_face_recognition_resnet_model_v1.dat"
VARIANTS = ("paste_only", "neutral", "smile")
SHEET_COLUMNS = ("A", "B", "paste-only", "neutral", "smile")

Box = tuple[int, int, int, int]


# ---------------------------------------------------------------------------- pure measures


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two (x0, y0, x1, y1) boxes (exclusive x1/y1); 0 if empty."""
    ax0, ay0, ax1, ay1 = (float(v) for v in a)
    bx0, by0, bx1, by1 = (float(v) for v in b)
    iw = max(0.0, min(ax1, bx1) - max(ax0, bx0))
    ih = max(0.0, min(ay1, by1) - max(ay0, by0))
    inter = iw * ih
    union = max(0.0, ax1 - ax0) * max(0.0, ay1 - ay0) + max(0.0, bx1 - bx0) * max(0.0, by1 - by0)
    union -= inter
    return inter / union if union > 0 else 0.0


def best_overlap(boxes: Sequence[Sequence[float]], reference: Sequence[float]):
    """(index, IoU) of the box that overlaps ``reference`` most; (None, 0.0) without boxes."""
    if not boxes:
        return None, 0.0
    ious = [box_iou(box, reference) for box in boxes]
    index = int(np.argmax(ious))
    return index, float(ious[index])


def expression_ratio(points: np.ndarray) -> float:
    """Mouth width over outer-eye span from dlib's 68 points ((68, 2), x/y in pixels).

    Scale-free and grows when the mouth corners pull apart, i.e. when the face smiles."""
    points = np.asarray(points, dtype=np.float64)
    if points.shape != (68, 2):
        raise ValueError(f"expression_ratio: need 68 (x, y) points, got {points.shape}")
    mouth = float(np.linalg.norm(points[MOUTH_CORNERS[1]] - points[MOUTH_CORNERS[0]]))
    eyes = float(np.linalg.norm(points[OUTER_EYE_CORNERS[1]] - points[OUTER_EYE_CORNERS[0]]))
    if eyes <= 0.0 or not math.isfinite(eyes):
        raise ValueError("expression_ratio: the outer eye corners coincide")
    return mouth / eyes


def descriptor_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Euclidean distance of two face descriptors (dlib: < 0.6 means the same person)."""
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"descriptor_distance: shapes differ, {a.shape} vs {b.shape}")
    return float(np.linalg.norm(a - b))


def outside_face(
    target_shape: Sequence[int], mask: np.ndarray, crop_box: Sequence[int]
) -> np.ndarray:
    """Bool (H, W) of B: True where the plan's mask, resized to B as paste_back does, is < 0.5.

    Pixels outside the crop box are outside the face. The feathered ramp's outer half counts
    as outside, so a pipeline that only touches the face still shows a finite PSNR there."""
    import cv2

    height, width = int(target_shape[0]), int(target_shape[1])
    mask = np.clip(np.asarray(mask, dtype=np.float32), 0.0, 1.0)
    if mask.ndim != 2:
        raise ValueError(f"outside_face: mask must be 2-D, got {mask.shape}")
    x0, y0, x1, y1 = (int(v) for v in crop_box)
    full = np.zeros((height, width), dtype=np.float32)
    ix0, iy0, ix1, iy1 = max(0, x0), max(0, y0), min(width, x1), min(height, y1)
    if x1 > x0 and y1 > y0 and ix1 > ix0 and iy1 > iy0:
        resized = cv2.resize(mask, (x1 - x0, y1 - y0), interpolation=cv2.INTER_LINEAR)
        full[iy0:iy1, ix0:ix1] = resized[iy0 - y0 : iy1 - y0, ix0 - x0 : ix1 - x0]
    return full < 0.5


def masked_psnr(reference: np.ndarray, candidate: np.ndarray, where: np.ndarray) -> float:
    """PSNR in dB (8-bit range) of ``candidate`` against ``reference`` over ``where`` (H, W).

    Identical pixels give :data:`~facefuse.quality.metrics.PSNR_CAP_DB` (JSON has no inf)."""
    a = np.asarray(reference, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    where = np.asarray(where, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"masked_psnr: images differ in shape, {a.shape} vs {b.shape}")
    if where.shape != a.shape[:2]:
        raise ValueError(f"masked_psnr: mask {where.shape} does not match {a.shape[:2]}")
    if not where.any():
        raise ValueError("masked_psnr: the mask selects no pixel")
    mse = float(np.mean((a[where] - b[where]) ** 2))
    if mse == 0.0:
        return PSNR_CAP_DB
    return min(10.0 * math.log10(255.0**2 / mse), PSNR_CAP_DB)


def select_pairs(
    source_ids: Sequence[str], target_ids: Sequence[str], limit: int | None, seed: int
) -> list[tuple[str, str]]:
    """Ordered (A, B) pairs with A != B; ``limit`` of them drawn with ``seed``, in order."""
    pairs = [(a, b) for a in source_ids for b in target_ids if a != b]
    if limit is None or limit >= len(pairs):
        return pairs
    chosen = random.Random(seed).sample(range(len(pairs)), limit)  # noqa: S311 - not crypto
    return [pairs[i] for i in sorted(chosen)]


def _median(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def _share(flags: Sequence[bool]) -> float | None:
    flags = [f for f in flags if f is not None]
    return sum(bool(f) for f in flags) / len(flags) if flags else None


def summarize(pairs: Sequence[dict], latencies_ms: Sequence[float] = ()) -> dict:
    """The report's summary from per-pair records (see :func:`evaluate` for their fields).

    Skipped pairs (``"skipped"`` set) are counted by reason and left out of every figure."""
    done = [p for p in pairs if not p.get("skipped")]
    skipped: dict[str, int] = {}
    for p in pairs:
        if p.get("skipped"):
            skipped[p["skipped"]] = skipped.get(p["skipped"], 0) + 1
    summary: dict = {"pairs": len(pairs), "evaluated": len(done), "skipped": skipped}
    for variant in VARIANTS:
        rows = [p[variant] for p in done if p.get(variant)]
        dist_a = [r["distance_a"] for r in rows]
        dist_b = [r["distance_b"] for r in rows]
        psnr = [r["psnr_outside_db"] for r in rows if r.get("psnr_outside_db") is not None]
        summary[variant] = {
            "n": len(rows),
            "face_found_share": _share([r["face_found"] for r in rows]),
            "nearer_a_share": _share(
                [a < b if a is not None and b is not None else None for a, b in zip(dist_a, dist_b)]
            ),
            "median_distance_a": _median(dist_a),
            "median_distance_b": _median(dist_b),
            "psnr_outside_min_db": min(psnr) if psnr else None,
            "psnr_outside_median_db": _median(psnr),
        }
    ratios = []
    for p in done:
        smile, neutral = (p.get(v) or {} for v in ("smile", "neutral"))
        if smile.get("expression") is not None and neutral.get("expression"):
            ratios.append(smile["expression"] / neutral["expression"])
    summary["instruction_effect"] = {
        "n": len(ratios),
        "smile_wider_share": _share([r > 1.0 for r in ratios]),
        "median_smile_over_neutral": _median(ratios),
    }
    summary["latency_ms"] = {
        "requests": len(latencies_ms),
        "median": _median(list(latencies_ms)),
    }
    return summary


def expression_check(ratios: dict[str, tuple[float | None, float | None]]) -> dict:
    """The measure on real photos: per person (neutral ratio, smiling ratio).

    People with no face in either photo are listed under ``no_face`` and left out."""
    measured = {k: v for k, v in ratios.items() if v[0] is not None and v[1] is not None}
    separated = sorted(k for k, (n, s) in measured.items() if s > n)
    return {
        "people": len(measured),
        "separated": len(separated),
        "separated_share": len(separated) / len(measured) if measured else None,
        "median_smiling_over_neutral": _median([s / n for n, s in measured.values() if n]),
        "not_separated": sorted(set(measured) - set(separated)),
        "no_face": sorted(set(ratios) - set(measured)),
    }


def _fit(image: np.ndarray, side: int) -> np.ndarray:
    """``image`` (RGB uint8) scaled to fit a side x side cell, centred on grey."""
    import cv2

    height, width = image.shape[:2]
    scale = side / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    small = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    cell = np.full((side, side, 3), 64, dtype=np.uint8)
    y, x = (side - size[1]) // 2, (side - size[0]) // 2
    cell[y : y + size[1], x : x + size[0]] = small
    return cell


def _text(canvas: np.ndarray, text: str, origin: tuple[int, int], scale: float = 0.4) -> None:
    import cv2

    cv2.putText(
        canvas, text, origin, cv2.FONT_HERSHEY_SIMPLEX, scale, (255, 255, 255), 1, cv2.LINE_AA
    )


def contact_sheet(
    rows: Sequence[Sequence[np.ndarray | None]],
    row_labels: Sequence[str],
    column_labels: Sequence[str] = SHEET_COLUMNS,
    cell: int = 160,
) -> np.ndarray:
    """RGB uint8 grid: a header with ``column_labels``, then per row a label line and cells.

    A missing image (None) leaves its cell dark."""
    if len(rows) != len(row_labels):
        raise ValueError("contact_sheet: one label per row")
    columns = len(column_labels)
    header, label_h, gap = 20, 16, 2
    height = header + len(rows) * (label_h + cell + gap)
    width = columns * (cell + gap)
    sheet = np.full((height, width, 3), 24, dtype=np.uint8)
    for c, name in enumerate(column_labels):
        _text(sheet, name, (c * (cell + gap) + 4, 14), 0.45)
    for r, (images, label) in enumerate(zip(rows, row_labels)):
        if len(images) != columns:
            raise ValueError(f"contact_sheet: row {r} has {len(images)} images, not {columns}")
        top = header + r * (label_h + cell + gap)
        _text(sheet, label, (4, top + 12), 0.38)
        for c, image in enumerate(images):
            if image is None:
                continue
            x = c * (cell + gap)
            sheet[top + label_h : top + label_h + cell, x : x + cell] = _fit(image, cell)
    return sheet


# ---------------------------------------------------------------------------- dlib instruments


@dataclass
class FaceRecord:
    """One face as the evaluation sees it: box (x0, y0, x1, y1), 68 points, descriptor."""

    box: Box
    points: np.ndarray
    descriptor: np.ndarray

    @property
    def expression(self) -> float:
        return expression_ratio(self.points)


class FaceMeter:
    """dlib HOG (upsample 1), 68-point predictor and ResNet descriptor; evaluation only.

    The models are loaded here, not in :mod:`facefuse.face.models`, so that the serving path
    never loads the 68-point predictor. One instance per thread."""

    def __init__(self) -> None:
        from facefuse.face.models import _require_dlib, model_file

        dlib = _require_dlib()
        self._dlib = dlib
        self.detector = dlib.get_frontal_face_detector()
        self.predictor = dlib.shape_predictor(str(model_file(LANDMARKS68_FILE)))
        self.encoder = dlib.face_recognition_model_v1(str(model_file(DESCRIPTOR_FILE)))

    def detect(self, rgb: np.ndarray) -> list[Box]:
        """Face boxes, clipped to the image, largest first."""
        height, width = rgb.shape[:2]
        boxes = []
        for r in self.detector(np.ascontiguousarray(rgb), HOG_UPSAMPLE):
            box = (
                max(0, r.left()),
                max(0, r.top()),
                min(width, r.right() + 1),
                min(height, r.bottom() + 1),
            )
            if box[2] > box[0] and box[3] > box[1]:
                boxes.append(box)
        return sorted(boxes, key=lambda b: (b[2] - b[0]) * (b[3] - b[1]), reverse=True)

    def measure(self, rgb: np.ndarray, box: Sequence[int]) -> FaceRecord:
        """68 points and descriptor of the face in ``box``."""
        rgb = np.ascontiguousarray(rgb)
        x0, y0, x1, y1 = (int(v) for v in box)
        shape = self.predictor(rgb, self._dlib.rectangle(x0, y0, x1 - 1, y1 - 1))
        points = np.array([(p.x, p.y) for p in shape.parts()], dtype=np.float64)
        descriptor = np.array(self.encoder.compute_face_descriptor(rgb, shape), dtype=np.float64)
        return FaceRecord((x0, y0, x1, y1), points, descriptor)

    def main_face(self, rgb: np.ndarray) -> FaceRecord | None:
        boxes = self.detect(rgb)
        return self.measure(rgb, boxes[0]) if boxes else None


def measure_result(
    meter: FaceMeter,
    result: np.ndarray,
    target: np.ndarray,
    source_face: FaceRecord,
    target_face: FaceRecord,
    outside: np.ndarray,
) -> dict:
    """Figures of one fused image (B's shape) against A's and B's faces."""
    boxes = meter.detect(result)
    index, iou = best_overlap(boxes, target_face.box)
    found = index is not None and iou >= MIN_IOU
    box = boxes[index] if found else target_face.box
    face = meter.measure(result, box)
    return {
        "face_found": bool(found),
        "iou": round(iou, 4),
        "measured_at": "detected face" if found else "B's face box",
        "distance_a": descriptor_distance(face.descriptor, source_face.descriptor),
        "distance_b": descriptor_distance(face.descriptor, target_face.descriptor),
        "expression": face.expression,
        "psnr_outside_db": masked_psnr(target, result, outside),
    }


# ---------------------------------------------------------------------------- the run


def image_files(folder: Path, field_name: str) -> dict[str, Path]:
    """stem -> image path of the PNG/JPEG/WEBP files directly in ``folder``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InvalidInput(field_name, f"must be a folder of images; {folder} is not a directory")
    files = {
        p.stem: p
        for p in sorted(folder.iterdir())
        if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
    }
    if not files:
        raise InvalidInput(
            field_name, f"must hold PNG/JPEG/WEBP images; {folder} has none ({IMAGE_SUFFIXES})"
        )
    return files


def parse_ids(text: str) -> list[str]:
    """IDs separated by commas, whitespace or lines; '#' starts a comment."""
    ids = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        ids += [t for t in line.replace(",", " ").split() if t]
    return list(dict.fromkeys(ids))


@dataclass
class EvalConfig:
    """What :func:`evaluate` runs; ``params`` go to every fusion request."""

    sources: Path
    targets: Path
    ids: list[str] | None = None
    pairs: int | None = None
    seed: int = 0
    size: int = 512
    params: dict = field(default_factory=dict)
    sheet_rows: int = 8
    smiling: Path | None = None


@dataclass
class Loaded:
    path: Path
    data: bytes
    rgb: np.ndarray | None
    face: FaceRecord | None
    error: str | None = None


FuseFn = Callable[[bytes, bytes, str], bytes]


def _load(path: Path, meter: FaceMeter, cache: dict) -> Loaded:
    from facefuse.face.imageio import decode_image

    key = path.resolve()
    if key not in cache:
        data = path.read_bytes()
        try:
            rgb = decode_image(data, path.name)
        except InvalidInput as exc:
            cache[key] = Loaded(path, data, None, None, exc.expectation)
        else:
            cache[key] = Loaded(path, data, rgb, meter.main_face(rgb))
    return cache[key]


def _usable(files: dict[str, Path], field_name: str, meter, cache) -> None:
    loaded = [_load(p, meter, cache) for p in files.values()]
    if not any(item.rgb is not None for item in loaded):
        reasons = "; ".join(f"{item.path.name}: {item.error}" for item in loaded[:3])
        raise InvalidInput(field_name, f"no usable image (none could be decoded: {reasons})")


def _choose(files: dict[str, Path], ids: list[str] | None) -> dict[str, Path]:
    return files if ids is None else {i: files[i] for i in ids if i in files}


@dataclass
class Prepared:
    """Checked inputs of a run: the images by ID, the pairs, and the decoded/measured cache."""

    sources: dict[str, Path]
    targets: dict[str, Path]
    pairs: list[tuple[str, str]]
    cache: dict


def prepare(config: EvalConfig, meter: FaceMeter) -> Prepared:
    """Check the folders, IDs and pair count, decode and measure every image once.

    Raises :class:`InvalidInput` naming the option (``--sources``, ``--ids``, ``--pairs``...)."""
    if config.pairs is not None and config.pairs < 1:
        raise InvalidInput("--pairs", f"must be at least 1, got {config.pairs}")
    sources = image_files(config.sources, "--sources")
    targets = image_files(config.targets, "--targets")
    if config.ids is not None:
        unknown = [i for i in config.ids if i not in sources and i not in targets]
        if unknown:
            raise InvalidInput(
                "--ids", f"no image named {', '.join(unknown[:5])} in --sources or --targets"
            )
        sources, targets = _choose(sources, config.ids), _choose(targets, config.ids)
        for name, chosen in (("--sources", sources), ("--targets", targets)):
            if not chosen:
                raise InvalidInput("--ids", f"none of the IDs has an image in {name}")
    pairs = select_pairs(list(sources), list(targets), config.pairs, config.seed)
    if not pairs:
        raise InvalidInput("--ids", "need two different people (file stems) to make a pair")
    cache: dict = {}
    _usable(sources, "--sources", meter, cache)
    _usable(targets, "--targets", meter, cache)
    return Prepared(sources, targets, pairs, cache)


def evaluate(
    config: EvalConfig,
    fuse: FuseFn,
    meter: FaceMeter | None = None,
    log: Callable[[str], None] = lambda line: None,
    prepared: Prepared | None = None,
) -> tuple[dict, np.ndarray | None]:
    """Run the evaluation; returns (report dict, contact sheet RGB or None).

    ``fuse(source_bytes, target_bytes, instruction) -> PNG bytes`` is the served model;
    ``prepared`` is :func:`prepare`'s result when the caller checked the inputs first."""
    from facefuse.face.expression_edit import ExpressionEdit
    from facefuse.face.fusion import paste_back, prepare_fusion
    from facefuse.face.imageio import decode_image

    meter = meter or FaceMeter()
    prepared = prepared or prepare(config, meter)
    sources, targets, chosen_pairs, cache = (
        prepared.sources,
        prepared.targets,
        prepared.pairs,
        prepared.cache,
    )

    records: list[dict] = []
    latencies: list[float] = []
    sheet_rows: list[list[np.ndarray | None]] = []
    sheet_labels: list[str] = []
    for number, (a_id, b_id) in enumerate(chosen_pairs, 1):
        started = time.perf_counter()
        a, b = _load(sources[a_id], meter, cache), _load(targets[b_id], meter, cache)
        record: dict = {"a": a_id, "b": b_id}
        records.append(record)
        if a.rgb is None or b.rgb is None:
            record["skipped"] = "unreadable image"
            record["detail"] = a.error or b.error
            continue
        if a.face is None or b.face is None:
            record["skipped"] = "no face"
            record["detail"] = "no face in A" if a.face is None else "no face in B"
            continue
        try:
            plan = prepare_fusion(a.rgb, b.rgb, config.size)
            served = prepare_fusion(a.rgb, b.rgb, config.size, expression=ExpressionEdit())
        except InvalidInput as exc:  # the serving cascade missed a face the HOG found
            record["skipped"] = "no face"
            record["detail"] = f"pipeline: {exc}"
            continue
        outside = outside_face(b.rgb.shape, served.mask, served.crop_box)
        images = {"paste_only": paste_back(b.rgb, plan.composite, plan)}
        try:
            for variant, instruction in (
                ("neutral", NEUTRAL_INSTRUCTION),
                ("smile", SMILE_INSTRUCTION),
            ):
                request_started = time.perf_counter()
                png = fuse(a.data, b.data, instruction)
                latencies.append(1000.0 * (time.perf_counter() - request_started))
                images[variant] = decode_image(png, "IMAGE")
        except InvalidInput as exc:  # the server refused the pair (e.g. its own no-face)
            record["skipped"] = "server refused"
            record["detail"] = str(exc)
            continue
        for variant, image in images.items():
            if image.shape != b.rgb.shape:
                raise InvalidInput("IMAGE", f"expected B's shape {b.rgb.shape}, got {image.shape}")
            record[variant] = measure_result(meter, image, b.rgb, a.face, b.face, outside)
        record["seconds"] = round(time.perf_counter() - started, 3)
        if len(sheet_rows) < config.sheet_rows:
            sheet_rows.append(
                [a.rgb, b.rgb, images["paste_only"], images["neutral"], images["smile"]]
            )
            n, s = record["neutral"], record["smile"]
            sheet_labels.append(
                f"{a_id} -> {b_id}   d(A): paste {record['paste_only']['distance_a']:.2f}, "
                f"neutral {n['distance_a']:.2f}, smile {s['distance_a']:.2f}   "
                f"mouth smile/neutral {s['expression'] / n['expression']:.2f}"
            )
        log(_pair_line(number, len(chosen_pairs), record))

    report = {
        "config": {
            "sources": str(config.sources),
            "targets": str(config.targets),
            "ids": config.ids,
            "pairs_requested": config.pairs,
            "seed": config.seed,
            "size": config.size,
            "params": config.params,
            "instructions": {"neutral": NEUTRAL_INSTRUCTION, "smile": SMILE_INSTRUCTION},
            "min_iou": MIN_IOU,
            "hog_upsample": HOG_UPSAMPLE,
            "same_person_distance": SAME_PERSON_DISTANCE,
        },
        "summary": summarize(records, latencies),
        "pairs": records,
        "latencies_ms": [round(v, 2) for v in latencies],
    }
    seconds = [r["seconds"] for r in records if "seconds" in r]
    report["summary"]["seconds_per_pair_median"] = _median(seconds)
    if config.smiling is not None:
        report["expression_check"] = london_check(config.sources, config.smiling, meter, cache)
    sheet = contact_sheet(sheet_rows, sheet_labels) if sheet_rows else None
    return report, sheet


def london_check(neutral_dir: Path, smiling_dir: Path, meter: FaceMeter, cache: dict) -> dict:
    """The expression ratio on photos themselves: each person's smiling vs neutral photo
    (same file stem in both folders; all such people, whatever --ids says)."""
    neutral = image_files(neutral_dir, "--sources")
    smiling = image_files(smiling_dir, "--smiling")
    common = sorted(set(neutral) & set(smiling))
    if not common:
        raise InvalidInput("--smiling", f"no file stem of {smiling_dir} is in --sources")
    ratios = {}
    for person in common:
        pair = [_load(d[person], meter, cache).face for d in (neutral, smiling)]
        ratios[person] = tuple(f.expression if f is not None else None for f in pair)
    result = expression_check(ratios)
    result["folders"] = {"neutral": str(neutral_dir), "smiling": str(smiling_dir)}
    return result


def _pair_line(number: int, total: int, record: dict) -> str:
    if record.get("skipped"):
        return f"[{number}/{total}] {record['a']}->{record['b']}: skipped ({record['skipped']})"
    n, s, p = record["neutral"], record["smile"], record["paste_only"]
    return (
        f"[{number}/{total}] {record['a']}->{record['b']}: {record['seconds']:.1f} s; "
        f"paste dA {p['distance_a']:.3f} dB {p['distance_b']:.3f}; "
        f"neutral dA {n['distance_a']:.3f} dB {n['distance_b']:.3f} found {n['face_found']}; "
        f"smile/neutral {s['expression'] / n['expression']:.3f}"
    )


def to_json(report: dict) -> dict:
    """The report with numpy scalars turned into Python numbers and floats rounded."""

    def clean(value):
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if isinstance(value, (np.floating, float)):
            return round(float(value), 4)
        if isinstance(value, (np.integer,)):
            return int(value)
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, Path):
            return str(value)
        return value

    return clean(report)


# ------------------------------------------------------------------ expression cases (issue 30)

NOTHING_INSTRUCTION = "portrait photo"  # asks for no expression
SLIGHT_INSTRUCTION = "make them smile slightly"
BIG_INSTRUCTION = "give them a big smile"
LIPS_MIDDLE = (62, 66)  # dlib 68: inner lips, upper and lower middle
# case: (A's photo, B's photo, instruction, A's photo of the same expression as the ask)
EXPRESSION_CASES = {
    "b_smiles": ("neutral", "smiling", NOTHING_INSTRUCTION, "smiling"),
    "a_smiles": ("smiling", "neutral", NOTHING_INSTRUCTION, "neutral"),
    "make_smile": ("neutral", "neutral", SMILE_INSTRUCTION, "smiling"),
    "keep_neutral": ("neutral", "smiling", NEUTRAL_INSTRUCTION, "neutral"),
    "slight_smile": ("neutral", "neutral", SLIGHT_INSTRUCTION, "smiling"),
    "big_smile": ("neutral", "neutral", BIG_INSTRUCTION, "smiling"),
}
CASE_TITLES = {
    "b_smiles": "A neutral, B smiling, nothing asked",
    "a_smiles": "A smiling, B neutral, nothing asked",
    "make_smile": "'make them smile' on a neutral B",
    "keep_neutral": "'keep a neutral expression' on a smiling B",
    "slight_smile": "'smile slightly' on a neutral B",
    "big_smile": "'a big smile' on a neutral B",
}
SHEET_CASES = ("b_smiles", "a_smiles", "make_smile", "keep_neutral")
# Phrasings (``--cases phrasings``): each smile phrasing on a neutral B should reach at least
# half of "make them smile"'s effect; each negation on a smiling B should keep it neutral.
SMILE_PHRASINGS = {
    "grin": "give them a grin", "happy": "make her look happy",
    "warm": "a warm smile please", "beaming": "he should be beaming",
    "put_smile": "put a smile on her face", "cheerful": "cheerful expression, keep the glasses",
    "zh_smile": "让他微笑", "zh_laugh": "请让她笑一笑", "zh_big": "让她大笑",
    "zh_trad": "讓他微笑", "zh_happy": "笑得开心一点", "zh_face": "面带笑容",
}  # fmt: skip
NEGATIONS = {
    "dont": "don't smile", "no_smile": "no smile", "stop": "stop smiling",
    "serious": "look serious", "zh_dont": "别笑", "zh_neutral": "保持中性表情",
    "zh_no": "不要笑", "zh_serious": "表情严肃一点",
}  # fmt: skip
PHRASING_CASES = {
    **{f"say_{k}": ("neutral", "neutral", v, "smiling") for k, v in SMILE_PHRASINGS.items()},
    **{f"neg_{k}": ("neutral", "smiling", v, "neutral") for k, v in NEGATIONS.items()},
}
EXPRESSION_CASES.update(PHRASING_CASES)
CASE_TITLES.update({c: f"{v[2]!r} on a {v[1]} B" for c, v in PHRASING_CASES.items()})
CORE_CASES = tuple(c for c in EXPRESSION_CASES if c not in PHRASING_CASES)


def corner_rise(points: np.ndarray) -> float:
    """dlib 68: how far the mouth corners sit above the inner lips' middle, in outer-eye
    spans (grows with a smile)."""
    p = np.asarray(points, dtype=np.float64)
    left, right = p[OUTER_EYE_CORNERS[0]], p[OUTER_EYE_CORNERS[1]]
    span = float(np.linalg.norm(right - left))
    along = (right - left) / span
    down = np.array([-along[1], along[0]])
    middle = (p[LIPS_MIDDLE[0]] + p[LIPS_MIDDLE[1]]) / 2
    corners = (p[MOUTH_CORNERS[0]] + p[MOUTH_CORNERS[1]]) / 2
    return float((middle - corners) @ down / span)


def smile_share(value: float, neutral: float, smiling: float) -> float | None:
    """Where ``value`` lies from a person's neutral (0) to their own smile (1); None when the
    person's two photos do not differ."""
    span = smiling - neutral
    return float((value - neutral) / span) if abs(span) > 1e-3 else None


def expression_pairs(ids: Sequence[str], pairs: int | None, seed: int) -> list[tuple[str, str]]:
    """(A, B) of different people: each person once as A with a partner drawn by ``seed``,
    then more rounds while ``pairs`` asks for more."""
    rng = random.Random(seed)  # noqa: S311 - sampling, not security
    ids = list(ids)
    out: list[tuple[str, str]] = []
    wanted = pairs or len(ids)
    while len(out) < wanted:
        for a in rng.sample(ids, len(ids)):
            out.append((a, rng.choice([b for b in ids if b != a])))
            if len(out) == wanted:
                break
    return out


FuseFieldsFn = Callable[..., tuple[bytes, dict]]


def evaluate_expression(
    london: Path,
    ids: Sequence[str],
    fuse: FuseFieldsFn,
    pairs: int | None = None,
    seed: int = 1,
    size: int = 128,
    cases: Sequence[str] = CORE_CASES,
    meter: FaceMeter | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> tuple[dict, np.ndarray | None]:
    """The expression cases on London people (``london``/neutral|smiling/ID.jpg): each
    output's share of A's own smile (mouth width and corner rise, from A's neutral to A's
    smiling photo), its descriptor distance to A's photo of the same expression and to B,
    whether it is nearer A, whether its face is found, B's PSNR outside the face and the
    latency. ``fuse(source, target, instruction) -> (PNG, INFO)``. Returns (report, sheet)."""
    from facefuse.face.expression_edit import ExpressionEdit
    from facefuse.face.fusion import prepare_fusion
    from facefuse.face.imageio import decode_image

    meter = meter or FaceMeter()
    photos: dict[tuple[str, str], Loaded] = {}
    cache: dict = {}
    for person in ids:
        for kind in ("neutral", "smiling"):
            photos[kind, person] = _load(Path(london) / kind / f"{person}.jpg", meter, cache)
    usable = [p for p in ids if all(photos[k, p].face is not None for k in ("neutral", "smiling"))]
    chosen = expression_pairs(usable, pairs, seed)
    records: list[dict] = []
    latencies: dict[str, list[float]] = {case: [] for case in cases}
    sheet: list[list[np.ndarray]] = []
    labels: list[str] = []
    for number, (a_id, b_id) in enumerate(chosen, 1):
        a_n, a_s = photos["neutral", a_id].face, photos["smiling", a_id].face
        width = (a_n.expression, a_s.expression)
        rise = (corner_rise(a_n.points), corner_rise(a_s.points))
        row: dict = {"a": a_id, "b": b_id}
        images: dict[str, np.ndarray] = {}
        for case in cases:
            a_kind, b_kind, instruction, same = EXPRESSION_CASES[case]
            a, b = photos[a_kind, a_id], photos[b_kind, b_id]
            started = time.perf_counter()
            try:
                png, info = fuse(a.data, b.data, instruction)
            except InvalidInput as exc:
                row[case] = {"skipped": str(exc)}
                continue
            latencies[case].append(1000.0 * (time.perf_counter() - started))
            image = decode_image(png, "IMAGE")
            images[case] = image
            plan = prepare_fusion(a.rgb, b.rgb, size, expression=ExpressionEdit())
            outside = outside_face(b.rgb.shape, plan.mask, plan.crop_box)
            figures = measure_result(meter, image, b.rgb, a.face, b.face, outside)
            boxes = meter.detect(image)
            index, iou = best_overlap(boxes, b.face.box)
            face = meter.measure(image, boxes[index] if index is not None and iou >= MIN_IOU
                                 else b.face.box)  # fmt: skip
            same_face = photos[same, a_id].face
            figures.update(
                smile_share=smile_share(face.expression, *width),
                rise_share=smile_share(corner_rise(face.points), *rise),
                distance_a_same=descriptor_distance(face.descriptor, same_face.descriptor),
                applied=(info.get("expression") or {}).get("coefficients", {}).get("applied"),
            )
            figures["nearer_a"] = figures["distance_a_same"] < figures["distance_b"]
            row[case] = figures
        records.append(row)
        if len(sheet) < 6 and all(c in images for c in SHEET_CASES):
            sheet.append(
                [
                    photos["neutral", a_id].rgb, photos["smiling", a_id].rgb,
                    photos["neutral", b_id].rgb, photos["smiling", b_id].rgb,
                    *(images[c] for c in SHEET_CASES),
                ]
            )  # fmt: skip
            labels.append(
                f"A {a_id}, B {b_id}; smile share: "
                + ", ".join(f"{c} {_pct(row[c]['smile_share'])}" for c in SHEET_CASES)
            )
        log(f"[{number}/{len(chosen)}] {a_id}->{b_id}: " + "; ".join(
            f"{c} {_pct(row[c].get('smile_share'))} d {row[c].get('distance_a_same', 0):.2f}"
            for c in cases if "skipped" not in row[c]
        ))  # fmt: skip
    summary = {case: _case_summary([r[case] for r in records], latencies[case]) for case in cases}
    report = {
        "config": {
            "london": str(london),
            "ids": list(ids),
            "pairs": len(chosen),
            "seed": seed,
            "cases": {
                c: dict(zip(("a", "b", "instruction", "same"), EXPRESSION_CASES[c])) for c in cases
            },
        },
        "summary": summary,
        "ordering": _ordering(records, cases),
        "phrasings": _phrasings(summary),
        "pairs": records,
    }
    columns = ("A neutral", "A smiling", "B neutral", "B smiling",
               *(CASE_TITLES[c] for c in SHEET_CASES))  # fmt: skip
    picture = _expression_sheet(sheet, labels, columns) if sheet else None
    return report, picture


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _case_summary(rows: list[dict], latencies: list[float]) -> dict:
    done = [r for r in rows if "skipped" not in r]
    shares = [r["smile_share"] for r in done if r["smile_share"] is not None]
    rises = [r["rise_share"] for r in done if r["rise_share"] is not None]
    return {
        "n": len(done),
        "skipped": len(rows) - len(done),
        "smile_share_median": _median(shares),
        "smile_share_at_least_40": float(np.mean([s >= 0.4 for s in shares])) if shares else None,
        "smile_share_at_most_50": float(np.mean([s <= 0.5 for s in shares])) if shares else None,
        "rise_share_median": _median(rises),
        "median_distance_a_same": _median([r["distance_a_same"] for r in done]),
        "nearer_a_share": float(np.mean([r["nearer_a"] for r in done])) if done else None,
        "face_found_share": float(np.mean([r["face_found"] for r in done])) if done else None,
        "psnr_outside_min_db": min((r["psnr_outside_db"] for r in done), default=None),
        "latency_ms_median": _median(latencies),
    }


def _phrasings(summary: dict) -> dict:
    """Each smile phrasing's median share over "make them smile"'s (target >= 0.5) and each
    negation's median share of A's own smile (target: near 0, at most 0.5)."""
    base = (summary.get("make_smile") or {}).get("smile_share_median")
    said = {c: s["smile_share_median"] for c, s in summary.items() if c.startswith("say_")}
    negated = {c: s["smile_share_median"] for c, s in summary.items() if c.startswith("neg_")}
    if not said and not negated:
        return {}
    ratio = {c: (v / base if v is not None and base else None) for c, v in said.items()}
    half = all(r is not None and r >= 0.5 for r in ratio.values()) if ratio and base else None
    neutral = all(v is not None and v <= 0.5 for v in negated.values()) if negated else None
    return {
        "make_smile_median": base,
        "smile_over_make_smile": ratio,
        "smile_at_least_half": half,
        "negation_share_median": negated,
        "negations_at_most_half": neutral,
    }


def _ordering(records: list[dict], cases: Sequence[str]) -> dict:
    """Share of pairs where big > normal > slight (mouth width share)."""
    names = ("slight_smile", "make_smile", "big_smile")
    if not all(n in cases for n in names):
        return {}
    ordered, n = 0, 0
    medians = {}
    for r in records:
        values = [r[c].get("smile_share") for c in names]
        if any(v is None for v in values):
            continue
        n += 1
        ordered += values[0] < values[1] < values[2]
    for c in names:
        medians[c] = _median([r[c]["smile_share"] for r in records
                              if r[c].get("smile_share") is not None])  # fmt: skip
    return {"pairs": n, "big_normal_slight_ordered_share": ordered / n if n else None,
            "median_smile_share": medians}  # fmt: skip


def _expression_sheet(rows, labels, columns, tile: int = 160) -> np.ndarray:
    """Faces cropped around the middle of each photo, one row per pair, titled columns."""
    import cv2

    def crop(image: np.ndarray) -> np.ndarray:
        h, w = image.shape[:2]
        side = int(min(h, w) * 0.62)
        y0, x0 = int(h * 0.47 - side / 2), (w - side) // 2
        y0 = max(0, min(h - side, y0))
        return cv2.resize(image[y0 : y0 + side, x0 : x0 + side], (tile, tile),
                          interpolation=cv2.INTER_AREA)  # fmt: skip

    head, label_h = 34, 18
    width = tile * len(columns)
    canvas = np.full((head + len(rows) * (tile + label_h), width, 3), 255, np.uint8)
    for i, name in enumerate(columns):
        words = name.split()
        lines = [" ".join(words[: (len(words) + 1) // 2]), " ".join(words[(len(words) + 1) // 2 :])]
        for k, line in enumerate(lines):
            cv2.putText(canvas, line, (i * tile + 4, 13 + 14 * k), cv2.FONT_HERSHEY_SIMPLEX,
                        0.36, (0, 0, 0), 1, cv2.LINE_AA)  # fmt: skip
    for r, (images, label) in enumerate(zip(rows, labels)):
        y = head + r * (tile + label_h)
        cv2.putText(canvas, label, (4, y + 13), cv2.FONT_HERSHEY_SIMPLEX, 0.38, (0, 0, 0), 1,
                    cv2.LINE_AA)  # fmt: skip
        for i, image in enumerate(images):
            canvas[y + label_h : y + label_h + tile, i * tile : (i + 1) * tile] = crop(image)
    return canvas
