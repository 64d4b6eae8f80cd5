"""Image fidelity metrics: PSNR and SSIM (scikit-image), on float images in [0, 1]."""

from __future__ import annotations

import numpy as np

# PSNR of identical images is infinite; report this instead so that JSON stays valid.
PSNR_CAP_DB = 100.0


def _pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"images differ in shape: {a.shape} vs {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("images contain NaN or inf")
    return a, b


def psnr(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB for images in [0, 1] (capped at PSNR_CAP_DB)."""
    from skimage.metrics import peak_signal_noise_ratio

    a, b = _pair(reference, candidate)
    if np.array_equal(a, b):
        return PSNR_CAP_DB
    return min(float(peak_signal_noise_ratio(a, b, data_range=1.0)), PSNR_CAP_DB)


def ssim(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Structural similarity (Gaussian-weighted, as in Wang et al. 2004) of HxW[x3] images."""
    from skimage.metrics import structural_similarity

    a, b = _pair(reference, candidate)
    return float(
        structural_similarity(
            a,
            b,
            data_range=1.0,
            channel_axis=-1 if a.ndim == 3 else None,
            gaussian_weights=True,
            sigma=1.5,
            use_sample_covariance=False,
        )
    )


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"arrays differ in shape: {a.shape} vs {b.shape}")
    return float(np.max(np.abs(a - b))) if a.size else 0.0
