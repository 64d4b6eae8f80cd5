"""Memory checks for precision variants: FP32 fallback on GPU, refusal to over-commit on CPU.

GPU (pipeline models): a light variant (FP16 ONNX / TensorRT engine) is served only while the
GPU keeps a configured margin of free memory. When free memory at load is under the margin, or
a call fails with an out-of-memory error at run time, the pipeline switches to the FP32
variant's models, logs why, and counts it in ``facefuse_precision_fallbacks_total``. The
decision is :func:`decide_gpu_variant` / :class:`FallbackController`, pure functions of the
readings so that tests drive them with simulated numbers.

CPU (ONNX-serving models): :func:`check_cpu_fits` refuses to load a graph whose estimated
working set exceeds the memory available to this process (``MemAvailable`` of
``/proc/meminfo``, bounded by the cgroup v2 limit when there is one), with a message naming
the file, the estimate and the reading. Estimate: ``1.5 x weight bytes + 512 MiB``; ORT keeps
the initializers and, for MatMul/Gemm, a pre-packed copy of their weights (the 0.5), and the
arena holds activations (a batch-16 SD-1.5 UNet step at 64x64 stays well under 512 MiB).

numpy-free: imported by the serving processes.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from facefuse.core.errors import ModelLoadError

log = logging.getLogger("facefuse.runtime.memory")

MIB = 1 << 20
WEIGHT_FACTOR = 1.5
ACTIVATION_ALLOWANCE = 512 * MIB
FALLBACK_VARIANT = "fp32"

_OOM_PATTERNS = re.compile(
    r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|OutOfMemory|"
    r"failed to allocate memory|std::bad_alloc|\bOOM\b",
    re.IGNORECASE,
)
_NOT_WEIGHTS = {".py", ".pbtxt", ".json", ".txt", ".md", ".plan", ".pyc"}


@dataclass(frozen=True)
class MemoryReading:
    """Free (available) bytes and where the number came from."""

    free_bytes: int
    source: str


# ----------------------------------------------------------------------------- readings
def cpu_available(
    meminfo: str | Path = "/proc/meminfo", cgroup: str | Path = "/sys/fs/cgroup"
) -> MemoryReading:
    """Memory this process can still use: MemAvailable, bounded by a cgroup v2 limit."""
    values = {}
    for line in Path(meminfo).read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[key] = int(parts[0]) * 1024  # kB
    reading = MemoryReading(values.get("MemAvailable", values.get("MemFree", 0)), "MemAvailable")
    limit_file, usage_file = Path(cgroup) / "memory.max", Path(cgroup) / "memory.current"
    try:
        limit = limit_file.read_text().strip()
        usage = int(usage_file.read_text().strip())
    except (OSError, ValueError):
        return reading
    if limit != "max" and int(limit) - usage < reading.free_bytes:
        return MemoryReading(max(0, int(limit) - usage), "cgroup memory.max - memory.current")
    return reading


def gpu_free(device: int = 0) -> MemoryReading | None:
    """Free memory of GPU ``device`` from NVML, else torch (only if already imported)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device)
            return MemoryReading(int(pynvml.nvmlDeviceGetMemoryInfo(handle).free), "NVML")
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no driver, no device: try the next source
        log.debug("NVML reading failed", exc_info=True)
    torch = sys.modules.get("torch")  # never import torch for this
    if torch is not None:
        try:
            if torch.cuda.is_available():
                free, _total = torch.cuda.mem_get_info(device)
                return MemoryReading(int(free), "torch.cuda.mem_get_info")
        except Exception:
            log.debug("torch.cuda.mem_get_info failed", exc_info=True)
    return None


# ----------------------------------------------------------------------------- CPU
def weight_bytes(graph: str | Path) -> int:
    """Bytes of a graph and its external data: ``<file>.data``, or (torch's exporter over 2 GB)
    one file per tensor beside it, i.e. every other plain file of the folder that is not a
    graph, config or code."""
    graph = Path(graph)
    total = graph.stat().st_size
    data = graph.with_name(graph.name + ".data")
    if data.is_file():
        return total + data.stat().st_size
    others = [
        p
        for p in graph.parent.iterdir()
        if p.is_file()
        and p != graph
        and p.suffix not in _NOT_WEIGHTS
        and not p.name.endswith((".onnx", ".onnx.data"))
    ]
    return total + sum(p.stat().st_size for p in others)


def estimate_working_set(graph: str | Path) -> int:
    return int(WEIGHT_FACTOR * weight_bytes(graph)) + ACTIVATION_ALLOWANCE


def check_cpu_fits(graph: str | Path, available: MemoryReading | None = None) -> int:
    """Raise ModelLoadError when ``graph``'s working set would not fit; returns the estimate."""
    graph = Path(graph)
    if not graph.is_file():
        raise ModelLoadError(f"{graph}: ONNX file not found; run `facefuse export`")
    estimate = estimate_working_set(graph)
    available = available or cpu_available()
    if estimate > available.free_bytes:
        raise ModelLoadError(
            f"{graph}: estimated working set {estimate / MIB:.0f} MiB "
            f"({WEIGHT_FACTOR} x {weight_bytes(graph) / MIB:.0f} MiB weights + "
            f"{ACTIVATION_ALLOWANCE / MIB:.0f} MiB activations) exceeds the "
            f"{available.free_bytes / MIB:.0f} MiB available ({available.source}); free memory, "
            "lower the instance count, or serve a smaller variant (`onnx_file` model.int8.onnx)"
        )
    return estimate


# ----------------------------------------------------------------------------- GPU
@dataclass(frozen=True)
class LoadDecision:
    variant: str
    fallback: bool
    reason: str


def decide_gpu_variant(
    requested: str, reading: MemoryReading | None, margin_bytes: int
) -> LoadDecision:
    """Serve ``requested`` unless the GPU's free memory is under ``margin_bytes`` (then FP32).

    ``margin_bytes <= 0`` disables the check; an unknown reading keeps the request (and says
    so): a missing NVML must not silently change what is served."""
    if requested == FALLBACK_VARIANT:
        return LoadDecision(requested, False, "fp32 requested")
    if margin_bytes <= 0:
        return LoadDecision(requested, False, "fallback margin disabled")
    if reading is None:
        return LoadDecision(requested, False, "free GPU memory unknown (no NVML/CUDA reading)")
    if reading.free_bytes < margin_bytes:
        return LoadDecision(
            FALLBACK_VARIANT,
            True,
            f"free GPU memory {reading.free_bytes / MIB:.0f} MiB ({reading.source}) is under "
            f"the {margin_bytes / MIB:.0f} MiB margin for {requested}",
        )
    return LoadDecision(
        requested,
        False,
        f"free GPU memory {reading.free_bytes / MIB:.0f} MiB >= margin {margin_bytes / MIB:.0f}",
    )


def is_oom(error: BaseException | str) -> bool:
    """Whether an exception (or a BLS error text) reports an out-of-memory condition."""
    if isinstance(error, MemoryError):
        return True
    return bool(_OOM_PATTERNS.search(str(error)))


class FallbackController:
    """The variant a pipeline currently runs, switched to FP32 once on low memory or OOM.

    ``report(from_variant, to_variant, reason, when)`` is called on every switch (the pipeline
    logs it and increments ``facefuse_precision_fallbacks_total``)."""

    def __init__(
        self,
        requested: str,
        report: Callable[[str, str, str, str], None] = lambda *_: None,
    ):
        self.requested = requested
        self.variant = requested
        self.report = report

    @property
    def fell_back(self) -> bool:
        return self.variant != self.requested

    def at_load(self, reading: MemoryReading | None, margin_bytes: int) -> LoadDecision:
        decision = decide_gpu_variant(self.requested, reading, margin_bytes)
        if decision.fallback:
            self._switch(decision.reason, "load")
        else:
            log.info("serving %s: %s", self.variant, decision.reason)
        return decision

    def on_error(self, error: BaseException | str) -> bool:
        """True when ``error`` was an OOM and the controller switched (the caller retries)."""
        if self.variant == FALLBACK_VARIANT or not is_oom(error):
            return False
        self._switch(f"out of memory at run time: {str(error).splitlines()[0][:200]}", "run")
        return True

    def _switch(self, reason: str, when: str) -> None:
        previous, self.variant = self.variant, FALLBACK_VARIANT
        log.warning("precision fallback %s -> %s at %s: %s", previous, self.variant, when, reason)
        self.report(previous, self.variant, reason, when)
