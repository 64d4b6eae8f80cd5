"""ONNX Runtime sessions for the serving models, and real batching of Triton requests.

The Python backend's dynamic batcher hands ``execute`` a list of requests and stacks nothing.
:func:`run_batched` concatenates the inputs of requests whose non-batch shapes agree into one
forward and splits the outputs back, so a "batch" is a real batched forward. numpy and
onnxruntime only: serving processes never import torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from facefuse.core.errors import ModelLoadError


@dataclass(frozen=True)
class SessionOptions:
    """ONNX Runtime threading; 0 threads lets ORT decide (all cores).

    ``allow_spinning``: ORT's idle intra-op threads spin-wait for work by default. In a server
    where several models share a few cores, those spinning threads burn the cores that the busy
    model needs (tiny model through Triton at concurrency 1: 2428 ms per fusion without
    spinning, 2589 ms with it), so serving turns it off.
    """

    intra_op_threads: int = 0
    inter_op_threads: int = 1
    allow_spinning: bool = False


def ort_session_options(options: SessionOptions = SessionOptions()):
    """``onnxruntime.SessionOptions`` for ``options`` with every graph optimisation on."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = options.intra_op_threads
    so.inter_op_num_threads = options.inter_op_threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", str(int(options.allow_spinning)))
    return so


def open_session(
    path: str | Path,
    options: SessionOptions = SessionOptions(),
    runtime: str = "onnxruntime",
    precision: str = "bf16",
):
    """An ORT CPU session on ``path`` (or, with ``runtime="openvino"``, an OpenVINO one with
    the same interface at ``precision``, :mod:`facefuse.runtime.openvino`); a missing or
    corrupt file is a ModelLoadError naming it."""
    if runtime == "openvino":
        from facefuse.runtime.openvino import OpenVinoSession

        return OpenVinoSession(path, options.intra_op_threads, precision)
    if runtime != "onnxruntime":
        raise ModelLoadError(f"runtime must be onnxruntime or openvino here, got {runtime!r}")
    import onnxruntime as ort

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: ONNX file not found; run `facefuse export` first")
    so = ort_session_options(options)
    try:
        return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
        raise ModelLoadError(f"{path}: not a loadable ONNX model ({exc})") from exc


@dataclass
class BatchStats:
    """Counts of what :func:`run_batched` did in one call."""

    requests: int = 0
    forwards: int = 0
    samples: int = 0


def _group_key(inputs: dict[str, np.ndarray]) -> tuple:
    return tuple(sorted((name, a.shape[1:], a.dtype.str) for name, a in inputs.items()))


def run_batched(
    forward: Callable[[dict[str, np.ndarray]], Sequence[np.ndarray]],
    requests: Sequence[dict[str, np.ndarray]],
    max_rows: int | None = None,
) -> tuple[list[list[np.ndarray]], BatchStats]:
    """Run ``forward`` once per group of requests with equal non-batch shapes.

    Invariant: output ``i`` holds exactly the rows of request ``i``, in order, as if each
    request had been run alone. ``max_rows`` caps the rows of one forward.
    """
    stats = BatchStats(requests=len(requests))
    results: list[list[np.ndarray] | None] = [None] * len(requests)
    groups: dict[tuple, list[int]] = {}
    for index, inputs in enumerate(requests):
        groups.setdefault(_group_key(inputs), []).append(index)
    for members in groups.values():
        chunk: list[int] = []
        rows = 0
        for index in [*members, None]:
            size = None if index is None else len(next(iter(requests[index].values())))
            if chunk and (index is None or (max_rows and rows + size > max_rows)):
                _forward_chunk(forward, requests, chunk, results, stats)
                chunk, rows = [], 0
            if index is not None:
                chunk.append(index)
                rows += size
    return results, stats  # type: ignore[return-value]


def _forward_chunk(forward, requests, chunk, results, stats: BatchStats) -> None:
    names = list(requests[chunk[0]])
    feeds = {n: np.concatenate([requests[i][n] for i in chunk], axis=0) for n in names}
    outputs = forward(feeds)
    stats.forwards += 1
    stats.samples += len(next(iter(feeds.values())))
    offset = 0
    for i in chunk:
        rows = len(requests[i][names[0]])
        results[i] = [o[offset : offset + rows] for o in outputs]
        offset += rows


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports one)."""

    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_part(intra_op_threads: int, parts: int, cores: int | None = None) -> int:
    """ORT threads for each of ``parts`` concurrent runs: ``intra_op_threads`` when set (> 0),
    otherwise the usable cores shared out (at least 1), so that the parts together use them all."""
    if intra_op_threads > 0 or parts <= 1:
        return intra_op_threads
    return max(1, (cores or usable_cores()) // parts)


class PartsRunner:
    """``forward(feeds)`` over row slices run at the same time, outputs concatenated in row order.

    For graphs whose rows are independent (UNet, VAE, text encoder: no cross-row op), the result
    equals one forward of all rows. Dynamic INT8 graphs are the exception: they quantise
    activations with one scale per tensor, so a row's output depends on the rows it runs with
    (by quantisation noise, max abs ~0.02 on the UNet; ``facefuse bench unet`` reports it), as
    it does under Triton's dynamic batching.

    ONNX Runtime releases the GIL inside ``run`` and a session may run concurrently, so
    ``parts`` 1-thread runs of one session use ``parts`` cores; on the 2-core development
    machine two 1-thread runs side by side beat one 2-thread run by 1.1-1.3x
    (``facefuse bench unet``, docs/benchmarks.md). ``parts`` 1 calls ``forward`` directly.
    """

    def __init__(
        self, forward: Callable[[dict[str, np.ndarray]], Sequence[np.ndarray]], parts: int
    ):
        if parts < 1:
            raise ValueError(f"parts must be >= 1, got {parts}")
        self.forward, self.parts = forward, parts
        self._pool = None

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        rows = len(next(iter(feeds.values())))
        parts = min(self.parts, rows)
        if parts == 1:
            return list(self.forward(feeds))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.parts, thread_name_prefix="ort-part")
        bounds = np.linspace(0, rows, parts + 1).astype(int)
        futures = [
            self._pool.submit(self.forward, {n: a[lo:hi] for n, a in feeds.items()})
            for lo, hi in pairwise(bounds)
        ]
        outputs = [future.result() for future in futures]
        return [np.concatenate(column) for column in zip(*outputs)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
