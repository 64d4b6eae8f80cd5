"""Detection rate and per-stage cost of the detector cascade on a folder of images.

Each image is decoded with :func:`~facefuse.face.imageio.decode_image` (so the evaluation
sees what the service sees) and run through :func:`~facefuse.face.detect.find_face_traced`.
Models are loaded before timing, so the figures are steady-state per-request costs.
A stage's mean time is over the images that reached it, not over all images.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from facefuse.core.errors import InvalidInput
from facefuse.face.detect import default_stages, find_face_traced, warm_up
from facefuse.face.imageio import decode_image

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


@dataclass
class StageStats:
    """How often a stage ran, how often it found the face, and its total time."""

    name: str
    runs: int = 0
    hits: int = 0
    seconds: float = 0.0

    @property
    def mean_ms(self) -> float:
        return 1000.0 * self.seconds / self.runs if self.runs else 0.0


@dataclass
class EvalReport:
    """The outcome of :func:`evaluate_folder`."""

    folder: str
    stages: list[StageStats]
    images: int = 0
    detected: int = 0
    total_seconds: float = 0.0
    misses: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)
    detector_of: dict[str, str] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.detected / self.images if self.images else 0.0

    @property
    def mean_ms(self) -> float:
        return 1000.0 * self.total_seconds / self.images if self.images else 0.0

    def to_dict(self) -> dict:
        return {
            "folder": self.folder,
            "images": self.images,
            "detected": self.detected,
            "rate": round(self.rate, 4),
            "mean_ms_per_image": round(self.mean_ms, 2),
            "stages": [
                {**asdict(s), "seconds": round(s.seconds, 4), "mean_ms": round(s.mean_ms, 2)}
                for s in self.stages
            ],
            "misses": self.misses,
            "unreadable": self.unreadable,
            "detector_of": self.detector_of,
        }


def image_files(folder: str | Path) -> list[Path]:
    """Image files directly inside ``folder``, sorted by name."""
    root = Path(folder)
    if not root.is_dir():
        raise InvalidInput("DIR", f"must be a folder of images, {root} is not a directory")
    return sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def evaluate_folder(folder: str | Path, stages: Sequence[str] | None = None) -> EvalReport:
    """Run the cascade on every image in ``folder``; see the module docstring."""
    chosen = tuple(stages) if stages else default_stages()
    files = image_files(folder)
    warm_up(chosen)
    report = EvalReport(str(folder), [StageStats(name) for name in chosen])
    by_name = {s.name: s for s in report.stages}
    for path in files:
        try:
            rgb = decode_image(path.read_bytes(), path.name)
        except InvalidInput as exc:
            report.unreadable[path.name] = exc.expectation
            continue
        face, runs = find_face_traced(rgb, chosen)
        report.images += 1
        for run in runs:
            stats = by_name[run.name]
            stats.runs += 1
            stats.hits += int(run.found)
            stats.seconds += run.seconds
            report.total_seconds += run.seconds
        if face is None:
            report.misses.append(path.name)
        else:
            report.detected += 1
            report.detector_of[path.name] = face.detector
    return report


def format_report(report: EvalReport) -> str:
    """A short human-readable table of the report."""
    lines = [
        f"{report.folder}: {report.detected}/{report.images} faces detected "
        f"({100 * report.rate:.1f}%), {report.mean_ms:.1f} ms per image on average",
        f"{'stage':<14}{'runs':>6}{'hits':>6}{'mean ms':>10}",
    ]
    lines += [f"{s.name:<14}{s.runs:>6}{s.hits:>6}{s.mean_ms:>10.1f}" for s in report.stages]
    if report.misses:
        lines.append("missed: " + ", ".join(report.misses))
    for name, why in report.unreadable.items():
        lines.append(f"unreadable: {name}: {why}")
    return "\n".join(lines)
