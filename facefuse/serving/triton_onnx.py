"""Base class for Python-backend models that serve one ONNX graph with real batching.

A subclass names the graph's inputs and outputs; requests handed over by Triton's dynamic
batcher are concatenated into one ORT forward per shape group (:func:`run_batched`) and the
outputs split back per request. Counters of forwards and rows are exported as metrics so a
test can prove that batches larger than one formed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from facefuse.core import metrics
from facefuse.core.contract import TIMESTEP
from facefuse.core.errors import ModelLoadError
from facefuse.core.limits import DEFAULT_LIMITS, check_tensor
from facefuse.gpu.runtime import (
    ONNX_RUNTIME,
    OPENVINO,
    open_torch_session,
    runtime_of,
    torch_kind,
)
from facefuse.runtime.memory import check_cpu_fits
from facefuse.runtime.openvino import resolve_auto
from facefuse.runtime.sessions import (
    PartsRunner,
    SessionOptions,
    open_session,
    run_batched,
    threads_per_part,
)
from facefuse.serving.triton_io import TritonMetric, error_response, exit_with_parent, pb_utils

ONNX_FILE = "model.onnx"


def int_parameter(params: dict[str, str], key: str, default: int, minimum: int, model: str) -> int:
    """Config parameter ``key`` as an integer >= ``minimum``; a ModelLoadError naming the model
    and the parameter otherwise (Triton shows it as the load failure)."""
    raw = params.get(key, str(default))
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ModelLoadError(
            f"{model}: parameter {key} must be an integer >= {minimum}, got {raw!r}"
        )
    return value


class OnnxTritonModel:
    """Triton ``TritonPythonModel`` base: one ORT session, batched execute."""

    INPUTS: tuple[str, ...] = ()
    OUTPUTS: tuple[str, ...] = ()
    # per-input cast/reshape applied to each request's array before batching
    FLATTEN: tuple[str, ...] = ()
    # shape checks before the graph runs (facefuse.core.limits.check_tensor): spatial sides must
    # be multiples of SPATIAL_MULTIPLE and at most Limits.max_tensor_side // SIDE_SCALE
    SPATIAL_MULTIPLE: int = 1
    SIDE_SCALE: int = 1  # 8 for latents

    def initialize(self, args: dict) -> None:
        exit_with_parent()  # a metric call to a dead server blocks for ever: never outlive it
        config = json.loads(args["model_config"])
        self.name = config["name"]
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        # `runtime: auto`: OpenVINO bf16 on model.onnx for a large graph where the CPU computes
        # bf16 natively, ONNX Runtime on `onnx_file` elsewhere (runtime.openvino.resolve_auto)
        params = resolve_auto(params, version_dir)
        parts = int_parameter(params, "parallel_runs", 1, 1, self.name)
        threads = int_parameter(params, "intra_op_threads", 0, 0, self.name)
        options = SessionOptions(
            intra_op_threads=threads_per_part(threads, parts),
            inter_op_threads=int_parameter(params, "inter_op_threads", 1, 0, self.name),
            allow_spinning=params.get("allow_spinning", "false").lower() == "true",
        )
        self.max_rows = int(config.get("max_batch_size", 0)) or None
        # `runtime`: onnxruntime (default, CPU) or torch-cuda / torch-cpu (facefuse.gpu.runtime:
        # the PyTorch module in FP16 with CUDA graphs, behind the same session interface)
        self.runtime = runtime_of(params, self.name)
        log_line = f"{self.name}: runtime {self.runtime}, {params.get('onnx_file', ONNX_FILE)}"
        print(log_line, flush=True)  # the Python backend forwards stdout to the server log
        if self.runtime not in (ONNX_RUNTIME, OPENVINO):
            self.session = open_torch_session(
                torch_kind(self.INPUTS), params, self.name, version_dir, self.max_rows
            )
        else:
            graph = version_dir / params.get("onnx_file", ONNX_FILE)
            if params.get("check_memory", "true").lower() == "true":
                check_cpu_fits(
                    graph
                )  # refuse a variant that would not fit (facefuse.runtime.memory)
            # `runtime: openvino` reads the same ONNX file (`openvino_precision`: bf16 or f32)
            precision = params.get("openvino_precision", "bf16")
            self.session = open_session(graph, options, self.runtime, precision)
        # `parallel_runs` > 1: a forward of several rows runs as that many row slices at once
        # (facefuse.runtime.sessions.PartsRunner), each on `intra_op_threads` threads
        # (0: cores / parts)
        self.runner = PartsRunner(self._run_session, parts)
        # the graph's input signature, read once: requests are checked against it
        self.input_shapes = {i.name.lower(): i.shape for i in self.session.get_inputs()}
        self._init_metrics()

    def _init_metrics(self) -> None:
        labels = {"model": self.name}
        self.m_forwards = TritonMetric(
            metrics.ONNX_FORWARDS, "ONNX Runtime forwards run by a batching Python model", **labels
        )
        self.m_samples = TritonMetric(
            metrics.ONNX_SAMPLES, "rows (samples) in those forwards", **labels
        )
        self.m_requests = TritonMetric(
            metrics.ONNX_REQUESTS, "Triton requests served by a batching Python model", **labels
        )

    def _run_session(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(list(self.OUTPUTS), feeds)

    def _forward(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.runner(feeds)

    def _inputs(self, request) -> dict[str, np.ndarray]:
        pb = pb_utils()
        arrays = {}
        for name in self.INPUTS:
            array = pb.get_input_tensor_by_name(request, name).as_numpy()
            arrays[name] = array.reshape(-1) if name in self.FLATTEN else array
            self._check_shape(name, arrays[name].shape)
        return arrays

    def _check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Refuse a shape the graph cannot run (InvalidInput naming the input), not a 500."""
        if name.lower() in self.input_shapes:
            check_tensor(
                name,
                shape,
                self.input_shapes[name.lower()],
                spatial_multiple=self.SPATIAL_MULTIPLE,
                max_side=DEFAULT_LIMITS.max_tensor_side // self.SIDE_SCALE,
                max_sequence=DEFAULT_LIMITS.max_context_tokens,
            )

    def execute(self, requests):
        pb = pb_utils()
        responses: list = [None] * len(requests)
        good, feeds = [], []
        for i, request in enumerate(requests):
            try:
                feeds.append(self._inputs(request))
                good.append(i)
            except Exception as exc:
                responses[i] = error_response(exc, self.name)
        try:
            outputs, stats = run_batched(self._forward, feeds, self.max_rows)
        except Exception as exc:  # one failed forward fails the requests in it, not the model
            for i in good:
                responses[i] = error_response(exc, self.name)
            return responses
        self.m_forwards.increment(stats.forwards)
        self.m_samples.increment(stats.samples)
        self.m_requests.increment(stats.requests)
        for i, out in zip(good, outputs):
            tensors = [
                pb.Tensor(name, np.ascontiguousarray(o)) for name, o in zip(self.OUTPUTS, out)
            ]
            responses[i] = pb.InferenceResponse(output_tensors=tensors)
        return responses

    def finalize(self) -> None:
        self.runner.close()
        self.session = None


class LatentOnnxModel(OnnxTritonModel):
    """The UNet family (``unet``, ``unet_deep``, ``unet_shallow``): latents whose sides are
    multiples of 8 (three down-samplings in SD 1.x), timestep [B, 1] in Triton, [B] in the
    graph."""

    FLATTEN = (TIMESTEP.name,)
    SPATIAL_MULTIPLE = 8
    SIDE_SCALE = 8
