"""Adaptive denoising steps: fewer steps for smooth faces, more for detailed ones.

The number of steps is chosen from the complexity of the region that will be regenerated
(the masked face of the initial composite), measured with two cheap numpy statistics on the
luminance ``Y = 0.299 R + 0.587 G + 0.114 B`` (values in [0, 1]), each weighted by the soft
mask ``m`` (``sum_m(x) = sum(m * x) / sum(m)``):

- edge density ``E = sum_m( |grad Y| > T_EDGE )`` with ``|grad Y|`` the Sobel magnitude
  divided by 4 (so a step edge of height 1 reads 1), ``T_EDGE = 0.08``;
- high-frequency energy ``H = sum_m( (Y - blur(Y))^2 ) / (sum_m( (Y - mean_m Y)^2 ) + eps)``,
  the share of the region's variance above the scale of a 5x5 binomial blur (~ sigma 1).

Each is mapped linearly between a "smooth" and a "detailed" reference and clipped to [0, 1],
``e = clip((E - E_LO) / (E_HI - E_LO))`` with E_LO = 0.35, E_HI = 0.95 and
``h = clip((H - H_LO) / (H_HI - H_LO))`` with H_LO = 0.07, H_HI = 0.16 (calibrated on
composites of the shared portraits, where the median face reads E ~ 0.56, H ~ 0.10 and so
gets the default 20 steps); the complexity is ``c = (e + h) / 2`` and the steps are
``steps = round(MIN_STEPS + c * (MAX_STEPS - MIN_STEPS))`` with MIN_STEPS = 15 and
MAX_STEPS = 30. A flat region gives 15 steps, a fully textured one 30. DPM-Solver++ with 20
steps stays the default when adaptive steps are off or a request gives STEPS explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_STEPS = 15
MAX_STEPS = 30
T_EDGE = 0.08
E_LO, E_HI = 0.35, 0.95
H_LO, H_HI = 0.07, 0.16
WORK_SIDE = 128
_EPS = 1e-8


@dataclass(frozen=True)
class Complexity:
    """The measured statistics and the steps they give."""

    edge_density: float
    high_freq: float
    score: float
    steps: int

    def info(self) -> dict:
        return {
            "edge_density": round(self.edge_density, 4),
            "high_freq_energy": round(self.high_freq, 4),
            "complexity": round(self.score, 4),
            "steps": self.steps,
        }


def luminance(image: np.ndarray) -> np.ndarray:
    """HxWx3 (or HxW) in [0, 1] -> HxW float64 luminance."""
    image = np.asarray(image, dtype=np.float64)
    if image.ndim == 2:
        return image
    return image[..., 0] * 0.299 + image[..., 1] * 0.587 + image[..., 2] * 0.114


def _filter(y: np.ndarray, kernel_y: np.ndarray, kernel_x: np.ndarray) -> np.ndarray:
    """Separable 2-D correlation with edge padding (same size as ``y``)."""
    r = len(kernel_y) // 2
    padded = np.pad(y, r, mode="edge")
    rows = sum(k * padded[i : i + y.shape[0], :] for i, k in enumerate(kernel_y))
    return sum(k * rows[:, j : j + y.shape[1]] for j, k in enumerate(kernel_x))


def sobel_magnitude(y: np.ndarray) -> np.ndarray:
    """Sobel gradient magnitude / 4 (a unit step edge reads 1)."""
    smooth = np.array([1.0, 2.0, 1.0])
    diff = np.array([-1.0, 0.0, 1.0])
    gx = _filter(y, smooth, diff)
    gy = _filter(y, diff, smooth)
    return np.hypot(gx, gy) / 4.0


def blur(y: np.ndarray) -> np.ndarray:
    """5x5 binomial blur."""
    kernel = np.array([1.0, 4.0, 6.0, 4.0, 1.0]) / 16.0
    return _filter(y, kernel, kernel)


def downsample(x: np.ndarray, side: int = WORK_SIDE) -> np.ndarray:
    """Area-average HxW by the integer factor that brings its side to at most ~``side``."""
    factor = max(1, min(x.shape) // side)
    if factor == 1:
        return x
    h, w = (x.shape[0] // factor) * factor, (x.shape[1] // factor) * factor
    return x[:h, :w].reshape(h // factor, factor, w // factor, factor).mean(axis=(1, 3))


def measure(image: np.ndarray, mask: np.ndarray | None = None) -> Complexity:
    """Complexity of ``image`` (HxWx3 in [0, 1]) inside ``mask`` (HxW in [0, 1], soft)."""
    y = luminance(image)
    m = np.ones_like(y) if mask is None else np.asarray(mask, dtype=np.float64)
    if m.shape != y.shape:
        raise ValueError(f"mask shape {m.shape} != image shape {y.shape}")
    y, m = downsample(y), downsample(m)
    weight = float(m.sum())
    if weight <= _EPS:
        return Complexity(0.0, 0.0, 0.0, MIN_STEPS)

    def mean(x: np.ndarray) -> float:
        return float((m * x).sum() / weight)

    edges = mean(sobel_magnitude(y) > T_EDGE)
    variance = mean((y - mean(y)) ** 2)
    high = mean((y - blur(y)) ** 2) / (variance + _EPS) if variance > 1e-6 else 0.0
    score = (_ramp(edges, E_LO, E_HI) + _ramp(high, H_LO, H_HI)) / 2.0
    return Complexity(edges, high, score, steps_for(score))


def _ramp(value: float, low: float, high: float) -> float:
    return min(max((value - low) / (high - low), 0.0), 1.0)


def steps_for(score: float) -> int:
    """Map complexity in [0, 1] to steps in MIN_STEPS..MAX_STEPS (clipped)."""
    score = min(max(float(score), 0.0), 1.0)
    return round(MIN_STEPS + score * (MAX_STEPS - MIN_STEPS))
