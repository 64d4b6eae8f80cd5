"""Colour transfer: give a source face the skin tone of the target face.

Matches per-channel mean and standard deviation in CIE L*a*b* over a region (Reinhard et
al. 2001). The std ratio is clamped to [MIN_RATIO, MAX_RATIO] so a flat region cannot
amplify noise; the result stays float32 RGB in [0, 1].
"""

from __future__ import annotations

import cv2
import numpy as np

MIN_RATIO, MAX_RATIO = 0.5, 2.0
_MIN_PIXELS = 16


def _lab(rgb01: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(np.ascontiguousarray(rgb01, dtype=np.float32), cv2.COLOR_RGB2LAB)


def _stats(lab: np.ndarray, region: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pixels = lab[region]
    return pixels.mean(axis=0), pixels.std(axis=0)


def region_stats(rgb01: np.ndarray, region: np.ndarray) -> np.ndarray | None:
    """(2, 3) float64: L*a*b* mean and std of ``rgb01`` over the boolean ``region``, or None
    when the region has fewer than a handful of pixels (what :func:`match_color` matches to)."""
    if region.sum() < _MIN_PIXELS:
        return None
    return np.stack(_stats(_lab(rgb01), region)).astype(np.float64)


def match_color(
    source01: np.ndarray,
    target01: np.ndarray,
    source_region: np.ndarray,
    target_region: np.ndarray,
    target_stats: np.ndarray | None = None,
) -> np.ndarray:
    """``source01`` recoloured so its statistics in ``source_region`` match ``target01``'s in
    ``target_region`` (boolean HxW masks), or ``target_stats`` ((2, 3) mean and std, from
    :func:`region_stats`) when given. Returns ``source01`` unchanged when either region
    has fewer than a handful of pixels."""
    if source_region.sum() < _MIN_PIXELS or target_region.sum() < _MIN_PIXELS:
        return np.asarray(source01, dtype=np.float32)
    source_lab = _lab(source01)
    source_mean, source_std = _stats(source_lab, source_region)
    if target_stats is None:
        target_mean, target_std = _stats(_lab(target01), target_region)
    else:
        target_mean, target_std = (np.asarray(v, np.float32) for v in target_stats)
    ratio = np.clip(target_std / np.maximum(source_std, 1e-6), MIN_RATIO, MAX_RATIO)
    matched = (source_lab - source_mean) * ratio + target_mean
    rgb = cv2.cvtColor(matched.astype(np.float32), cv2.COLOR_LAB2RGB)
    return np.clip(rgb, 0.0, 1.0).astype(np.float32)
