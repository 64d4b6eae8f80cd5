"""OpenVINO behind the ONNX Runtime session interface, for the CPU graphs (served VAEs, UNet).

``openvino.Core`` reads the exported ``model.onnx`` directly. :class:`OpenVinoSession` has the
two methods the serving code calls on an ORT session, ``get_inputs()`` (``name``, ``shape``
with dynamic dimensions as strings) and ``run(output_names, feeds)``, so a model config picks
it with ``runtime: openvino`` and nothing else changes. ``precision`` is OpenVINO's
``INFERENCE_PRECISION_HINT``: ``f32``, or ``bf16`` (on CPUs with AMX or AVX-512 BF16 it runs
the matrix products in bfloat16; elsewhere OpenVINO falls back to f32). It is meant for the
plain fp32 export; OpenVINO's own INT8 needs its quantiser (NNCF), which is not shipped.

Invariants: ``run`` is thread-safe (one infer request per thread, as :class:`PartsRunner`
runs row slices side by side); a missing or unreadable graph is a ModelLoadError naming it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facefuse.core.errors import ModelLoadError

PRECISIONS = ("f32", "bf16")


@dataclass(frozen=True)
class NodeArg:
    """What ``onnxruntime.NodeArg`` offers the serving code: a name and a shape."""

    name: str
    shape: list


class OpenVinoSession:
    def __init__(self, path: str | Path, threads: int = 0, precision: str = "bf16"):
        try:
            import openvino as ov
        except ImportError as exc:
            raise ModelLoadError(
                "runtime openvino needs the openvino wheel: pip install 'facefuse[openvino]'"
            ) from exc
        if precision not in PRECISIONS:
            raise ModelLoadError(f"openvino precision must be one of {PRECISIONS}: {precision!r}")
        path = Path(path)
        if not path.is_file():
            raise ModelLoadError(f"{path}: ONNX file not found; run `facefuse export` first")
        core = ov.Core()
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision}
        if threads > 0:
            config["INFERENCE_NUM_THREADS"] = threads
        try:
            self.compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        except Exception as exc:  # OpenVINO raises RuntimeError subclasses of its own
            raise ModelLoadError(f"{path}: OpenVINO cannot compile it ({exc})") from exc
        self.path, self.precision = path, precision
        self._local = threading.local()

    def get_inputs(self) -> list[NodeArg]:
        return [_node(port) for port in self.compiled.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [_node(port) for port in self.compiled.outputs]

    def run(self, output_names, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        results = request.infer(feeds)
        names = output_names or [port.any_name for port in self.compiled.outputs]
        return [np.array(results[self.compiled.output(name)]) for name in names]


def _node(port) -> NodeArg:
    shape = [d.get_length() if d.is_static else f"dim{i}" for i, d in enumerate(port.partial_shape)]
    return NodeArg(port.any_name, shape)
