"""Piecewise-affine image warp over a triangulation of landmark points (OpenCV remap).

:func:`piecewise_affine` moves the pixels at ``source`` points to ``destination`` points: the
points (plus fixed anchors on the image border) are triangulated once, in the source shape
(Delaunay, scipy); every destination triangle samples its source triangle through the affine
map of its corners. Pixels no destination triangle covers keep their place, so a warp whose
moved points sit inside the image leaves the border region bit-identical.
"""

from __future__ import annotations

import functools

import cv2
import numpy as np
from scipy.spatial import Delaunay


def _anchors(shape: tuple[int, int], count: int = 4) -> np.ndarray:
    height, width = shape
    xs = np.linspace(0, width - 1, count + 1)
    ys = np.linspace(0, height - 1, count + 1)
    top = np.stack([xs, np.zeros_like(xs)], 1)
    bottom = np.stack([xs, np.full_like(xs, height - 1)], 1)
    left = np.stack([np.zeros_like(ys[1:-1]), ys[1:-1]], 1)
    right = np.stack([np.full_like(ys[1:-1], width - 1), ys[1:-1]], 1)
    return np.vstack([top, bottom, left, right])


@functools.lru_cache(maxsize=8)
def _grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
    ys.flags.writeable = xs.flags.writeable = False
    return ys, xs


def backward_map(
    source: np.ndarray, destination: np.ndarray, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """(map_x, map_y) float32 of ``shape`` for :func:`cv2.remap`: where each output pixel
    samples the input so that ``source`` points land on ``destination`` points."""
    height, width = shape
    src = np.asarray(source, np.float64).reshape(-1, 2)
    dst = np.asarray(destination, np.float64).reshape(-1, 2)
    if src.shape != dst.shape:
        raise ValueError(f"backward_map: {src.shape} source vs {dst.shape} destination points")
    anchors = _anchors(shape)
    src = np.vstack([src, anchors])
    dst = np.vstack([dst, anchors])
    triangles = Delaunay(src).simplices
    # per triangle: the affine map destination -> source (3x3 solve of its corners)
    d = np.concatenate([dst[triangles], np.ones((len(triangles), 3, 1))], axis=2)  # (T, 3, 3)
    s = src[triangles]  # (T, 3, 2)
    keep = np.abs(np.linalg.det(d)) > 1e-9
    triangles, d, s = triangles[keep], d[keep], s[keep]
    affine = np.linalg.solve(d, s)  # (T, 3, 2): [x y 1] @ affine = source xy
    index = np.zeros((height, width), np.int32)
    corners = np.round(dst[triangles] * 16).astype(np.int32)  # (T, 3, 2), 4 fractional bits
    for t in range(len(corners)):
        cv2.fillConvexPoly(index, corners[t], t + 1, cv2.LINE_8, 4)
    ys, xs = _grid(height, width)
    map_x, map_y = xs.copy(), ys.copy()
    inside = index > 0
    which = index[inside] - 1
    px, py = xs[inside], ys[inside]
    a = affine[which]  # (n, 3, 2)
    map_x[inside] = px * a[:, 0, 0] + py * a[:, 1, 0] + a[:, 2, 0]
    map_y[inside] = px * a[:, 0, 1] + py * a[:, 1, 1] + a[:, 2, 1]
    return map_x.astype(np.float32), map_y.astype(np.float32)


def piecewise_affine(image: np.ndarray, source: np.ndarray, destination: np.ndarray) -> np.ndarray:
    """``image`` (H, W[, C]) warped so that ``source`` points move to ``destination``."""
    map_x, map_y = backward_map(source, destination, image.shape[:2])
    return cv2.remap(
        image, map_x, map_y, interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )
