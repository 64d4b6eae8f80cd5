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
from facefuse.runtime.memory import weight_bytes

PRECISIONS = ("f32", "bf16")
AUTO = "auto"


def native_bf16() -> bool:
    """True when OpenVINO's CPU plugin computes bf16 natively here (AMX or AVX-512 BF16)."""
    try:
        import openvino as ov

        return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except Exception:  # no openvino wheel, or a plugin that cannot say: not native
        return False


OPENVINO_MIN_MB = 100.0  # default `openvino_min_mb`


def resolve_auto(
    params: dict[str, str], version_dir: Path, bf16: bool | None = None
) -> dict[str, str]:
    """A model config's parameters with ``runtime: auto`` made concrete for this CPU and graph.

    OpenVINO at ``openvino_precision`` on ``openvino_file`` (default ``model.onnx``) in
    ``version_dir``, one run on all threads (``parallel_runs`` 1), where both hold: OpenVINO
    computes bf16 natively (``bf16``, default :func:`native_bf16`) and that file weighs at
    least ``openvino_min_mb`` (default 100) MB with its external data; elsewhere ONNX Runtime
    on ``onnx_file`` with the configured ``parallel_runs``. Any other ``runtime`` is returned
    unchanged. Measured on an AMX Xeon (docs/benchmarks.md): the SD-1.5-shaped UNet (3.4 GB)
    runs 3.28x ORT fp32 on OpenVINO bf16 against 1.29x on ORT INT8; the 24 MB faces UNet costs
    10% more CPU per image on OpenVINO than on ORT INT8 in two 1-thread runs (small graphs are
    op-overhead bound, large ones compute bound)."""
    if params.get("runtime", "").strip().lower() != AUTO:
        return params
    file = params.get("openvino_file", "model.onnx")
    path = Path(version_dir) / file
    try:
        min_mb = float(params.get("openvino_min_mb", OPENVINO_MIN_MB))
    except ValueError:
        raise ModelLoadError(
            f"{Path(version_dir).parent.name}: parameter openvino_min_mb must be a number of "
            f"megabytes, got {params['openvino_min_mb']!r}"
        ) from None
    large = path.is_file() and weight_bytes(path) >= min_mb * 1e6  # external data counted
    if large and (native_bf16() if bf16 is None else bf16):
        return {**params, "runtime": "openvino", "onnx_file": file, "parallel_runs": "1"}
    return {**params, "runtime": "onnxruntime"}


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
