"""CPU variants of an exported fp32 graph: dynamic INT8 and ORT offline graph optimisation.

Dynamic INT8 (``onnxruntime.quantization.quantize_dynamic``): weights are quantised to int8
offline, activations per call. Which operators to quantise is a measured choice, not a
default: on the SD-1.5-shaped UNet on ORT CPU, quantising only ``MatMul``/``Gemm`` (attention
projections, feed-forward, time embedding) made a call about 1.2x faster, while also
quantising ``Conv`` made it 2x *slower* (ORT's ConvInteger kernel is far slower than its fp32
convolution). ``facefuse bench unet`` re-measures the choice (``--with-conv`` adds the
Conv variant).

Weights use 7 bits (``reduce_range``) so that the u8 x s8 products cannot saturate on x86
CPUs without VNNI; see :func:`quantize_int8`. The served CPU UNet (:func:`fused_int8`) has its
attention fused into ORT's ``MultiHeadAttention`` first (:mod:`facefuse.export.attention`).

Every step keeps ONNX external data when the model is large (> 2 GB protobuf limit): the input
is loaded with its ``.data`` file, the output is written with ``<file>.data`` beside it.
"""

from __future__ import annotations

import logging
import multiprocessing
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from facefuse.runtime.variants import VARIANT_MODELS, onnx_file

DEFAULT_OP_TYPES = ("MatMul", "Gemm")
# Protobuf can't serialise 2 GiB; stay clear of it.
EXTERNAL_DATA_LIMIT = 1_800_000_000
# Graphs above this are fused in a child process before quantisation (see fused_int8).
FUSE_IN_CHILD_BYTES = 1_000_000_000
# A fused graph may differ from its source by this much x its output scale (fp32 rounding).
FUSION_TOLERANCE = 1e-4

log = logging.getLogger("facefuse.export.quantize")


def external_files(path: str | Path) -> list[Path]:
    """The external-data files a graph references (one ``.data`` file, or one per tensor as
    torch's exporter writes them for models over 2 GB)."""
    import onnx

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    locations = {
        entry.value
        for tensor in model.graph.initializer
        for entry in tensor.external_data
        if entry.key == "location"
    }
    return sorted(path.parent / location for location in locations)


def model_bytes(path: str | Path) -> int:
    """Size of a graph on disk including its external-data files."""
    path = Path(path)
    return path.stat().st_size + sum(f.stat().st_size for f in external_files(path) if f.is_file())


def remove_model(path: str | Path) -> None:
    """Delete a graph and its external-data file, if present."""
    path = Path(path)
    for candidate in (path, path.with_name(path.name + ".data")):
        candidate.unlink(missing_ok=True)


def save_model(model, path: str | Path, large: bool | None = None) -> Path:
    """Save an ``onnx.ModelProto``; weights go to ``<file>.data`` when the model is large."""
    import onnx

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_model(path)
    if large is None:
        large = model.ByteSize() > EXTERNAL_DATA_LIMIT
    if large:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, str(path))
    return path


@dataclass(frozen=True)
class ConversionResult:
    """One converted graph: where it went and its size next to the source's.

    ``fusion_check``: for :func:`fused_int8`, (max abs difference, output scale) of the fused
    fp32 graph against the source; None when the attention was not fused."""

    source: Path
    path: Path
    source_bytes: int
    bytes: int
    external_data: bool
    fusion_check: tuple[float, float] | None = None


def _result(source: Path, path: Path) -> ConversionResult:
    return ConversionResult(
        source,
        path,
        model_bytes(source),
        model_bytes(path),
        path.with_name(path.name + ".data").exists(),
    )


def quantize_int8(
    source: str | Path,
    destination: str | Path,
    op_types: Sequence[str] = DEFAULT_OP_TYPES,
    per_channel: bool = False,
) -> ConversionResult:
    """Dynamic INT8 quantisation of ``op_types`` in ``source`` into ``destination``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source, destination = Path(source), Path(destination)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: fp32 ONNX graph not found; run `facefuse export`")
    remove_model(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    large = model_bytes(source) > EXTERNAL_DATA_LIMIT
    quantize_dynamic(
        source,
        destination,
        op_types_to_quantize=list(op_types),
        per_channel=per_channel,
        weight_type=QuantType.QInt8,
        # 7-bit weights: x86 CPUs without VNNI (AVX2 / AVX-512F) multiply u8 x s8 pairs into
        # saturating int16, which broke the 32 dB gate on such a machine (AMD EPYC, AVX2);
        # the exported file must be right on every CPU it may be served on
        reduce_range=True,
        use_external_data_format=large,
        # weights only: activation x activation MatMuls (attention scores) stay fp32;
        # DefaultTensorType types the outputs of contrib ops (fused attention) that ONNX
        # shape inference does not know
        extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    if large:
        _normalise_external_data(destination)
    return _result(source, destination)


def _normalise_external_data(path: Path) -> None:
    """Rewrite a graph whose external data lives elsewhere than ``<file>.data``."""
    import onnx

    expected = path.with_name(path.name + ".data")
    locations = external_files(path)
    if locations in ([expected], []):
        return
    model = onnx.load(str(path), load_external_data=True)
    for location in locations:
        location.unlink(missing_ok=True)
    save_model(model, path, large=True)


def optimize_offline(
    source: str | Path, destination: str | Path, level: str = "extended"
) -> ConversionResult:
    """Write ORT's optimised graph (constant folding, fusions) so sessions start faster.

    ``basic``/``extended`` graphs are portable across CPUs; ``all`` adds layout changes that
    are specific to the machine that ran the optimisation, so it is not offered.
    """
    import onnxruntime as ort

    levels = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }
    if level not in levels:
        raise ValueError(f"level must be one of {tuple(levels)}, got {level!r}")
    source, destination = Path(source), Path(destination)
    remove_model(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    options = ort.SessionOptions()
    options.graph_optimization_level = levels[level]
    options.optimized_model_filepath = str(destination)
    if model_bytes(source) > EXTERNAL_DATA_LIMIT:
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", destination.name + ".data"
        )
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return _result(source, destination)


def export_cpu_variant(
    repository: str | Path, precision: str, op_types: Sequence[str] = DEFAULT_OP_TYPES
) -> list[ConversionResult]:
    """Write ``precision``'s files beside ``model.onnx`` for the models that variant touches."""

    if precision == "fp32":
        return []
    if precision != "int8":
        raise ValueError(f"--target cpu builds fp32 and int8 variants, not {precision!r}")
    root = Path(repository)
    results = []
    for model in VARIANT_MODELS[precision]:
        folder = root / model / "1"
        target = folder / onnx_file(precision)
        results.append(fused_int8(folder / "model.onnx", target, op_types))
    return results


def fuse_attention_contained(source: str | Path, destination: str | Path):
    """:func:`facefuse.export.attention.fuse_attention`, in a spawned child process for graphs
    over ``FUSE_IN_CHILD_BYTES``: the optimizer's memory does not go back to the OS, and fusing
    then quantising the SD-1.5 UNet in one process peaked over 24 GiB (OOM; each step alone
    11-14 GiB)."""

    from facefuse.export.attention import fuse_attention

    if model_bytes(source) <= FUSE_IN_CHILD_BYTES:
        return fuse_attention(source, destination)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fuse_attention, (source, destination))


def fused_int8(
    source: str | Path, destination: str | Path, op_types: Sequence[str] = DEFAULT_OP_TYPES
) -> ConversionResult:
    """The served CPU UNet: attention fused for the CPU (:mod:`facefuse.export.attention`),
    then dynamic INT8 of ``op_types``. The fused fp32 graph is a temporary file, used only if
    it matches ``source`` within ``FUSION_TOLERANCE`` x its output scale on a random call;
    otherwise (or if the optimizer fails on the graph) the plain graph is quantised, with a
    warning, and ``fusion_check`` is None."""

    from facefuse.export.attention import fusion_error

    source, destination = Path(source), Path(destination)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: fp32 ONNX graph not found; run `facefuse export`")
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=destination.parent) as scratch:
        fused = Path(scratch) / "fused.onnx"
        check = None
        try:
            fuse_attention_contained(source, fused)
            check = fusion_error(source, fused)
        except Exception as exc:  # ORT's optimizer on a graph it does not know
            log.warning("%s: attention fusion failed (%s); quantising the plain graph", source, exc)
        if check is not None and check[0] > FUSION_TOLERANCE * max(1.0, check[1]):
            log.warning(
                "%s: the fused graph differs from it by %.2e; quantising the plain graph",
                source,
                check[0],
            )
            check = None
        converted = quantize_int8(fused if check else source, destination, op_types)
    return replace(_result(source, converted.path), fusion_check=check)
