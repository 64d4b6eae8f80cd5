"""GPU variants: FP16 ONNX graphs and TensorRT engines, and the engine checks made at load.

FP16 ONNX (``model.fp16.onnx``): ``onnxruntime.transformers.float16`` converts weights and
compute to float16 and keeps fp32 inputs/outputs (``keep_io_types``), so the Triton configs'
tensor types do not change. Served by Triton's ``onnxruntime_onnx`` backend on GPU.

TensorRT (``model.plan``): built from the fp32 ONNX graph with the FP16 builder flag and one
optimisation profile whose batch axis spans 1..N (N = the config's ``max_batch_size``); the
spatial axes are fixed at the model's latent/image size and the text axis spans 1..3 prompt
chunks. Built with the ``tensorrt`` Python API, which exists only on GPU hosts: this module
imports it lazily and says so clearly when it is missing.

Engines are tied to the GPU model and the TensorRT version that built them (a mismatch is
"Version tag does not match" deep in Triton's log). Every build therefore writes
``model.plan.json`` beside the engine (TensorRT version, GPU name, compute capability,
profile, engine size and hash); :func:`check_engine` compares it with this host and the file
before the server loads the engine, and names the file and the expectation on a mismatch.

External data: sources over 2 GB are loaded with their external data and outputs are written
with ``<file>.data`` (TensorRT's ONNX parser reads external data beside the file).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from facefuse.core.contract import ENCODER_HIDDEN_STATES, LATENT, PIXELS, SAMPLE, TIMESTEP
from facefuse.core.errors import ModelLoadError
from facefuse.runtime.variants import VARIANT_MODELS, onnx_file

log = logging.getLogger("facefuse.export.gpu")

PLAN_FILE = "model.plan"
METADATA_SUFFIX = ".json"
DEFAULT_WORKSPACE = 4 << 30
MAX_TEXT_CHUNKS = 3


class TensorRTMissing(ModelLoadError):
    """The tensorrt Python package is not installed on this host."""


# ----------------------------------------------------------------------------- FP16 ONNX
def convert_fp16(source: str | Path, destination: str | Path, op_block_list=None):
    """FP16 copy of ``source`` with fp32 inputs/outputs; keeps external data when large."""
    import onnx
    from facefuse.export.quantize import (  # at call time: tests lower EXTERNAL_DATA_LIMIT
        EXTERNAL_DATA_LIMIT,
        _result,
        model_bytes,
        save_model,
    )
    from onnxruntime.transformers.float16 import convert_float_to_float16

    source, destination = Path(source), Path(destination)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: fp32 ONNX graph not found; run `facefuse export`")
    large = model_bytes(source) > EXTERNAL_DATA_LIMIT
    if large:
        # onnx's in-memory shape inference refuses protos over 2 GB, and without the inferred
        # types the converter breaks e.g. Resize scales: infer on the file instead (written
        # beside the source so that its external-data paths resolve), then convert.
        inferred = source.with_name(f".{source.stem}.inferred.onnx")
        try:
            onnx.shape_inference.infer_shapes_path(str(source), str(inferred))
            model = onnx.load(str(inferred), load_external_data=False)
            onnx.load_external_data_for_model(model, str(source.parent))
        finally:
            inferred.unlink(missing_ok=True)
    else:
        model = onnx.load(str(source), load_external_data=True)
    converted = convert_float_to_float16(
        model, keep_io_types=True, disable_shape_infer=large, op_block_list=op_block_list
    )
    save_model(converted, destination, large=converted.ByteSize() > EXTERNAL_DATA_LIMIT)
    return _result(source, destination)


# ----------------------------------------------------------------------------- profiles
Shape = tuple[int, ...]


@dataclass(frozen=True)
class InputProfile:
    """min / opt / max shape of one engine input."""

    name: str
    min: Shape
    opt: Shape
    max: Shape

    def __post_init__(self) -> None:
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ValueError(f"{self.name}: min/opt/max ranks differ")
        if any(not (a <= b <= c) for a, b, c in zip(self.min, self.opt, self.max)):
            raise ValueError(f"{self.name}: need min <= opt <= max, got {self}")
        if self.min[0] < 1:
            raise ValueError(f"{self.name}: batch must start at 1 or more")


def unet_profile(
    max_batch: int, latent: int, text_dim: int, channels: int = 4
) -> list[InputProfile]:
    """Batch 1..max_batch (opt: 2, one CFG step), fixed latent side, 1..3 prompt chunks."""
    opt = min(2, max_batch)
    seq = 77 * MAX_TEXT_CHUNKS
    return [
        InputProfile(
            SAMPLE.name,
            (1, channels, latent, latent),
            (opt, channels, latent, latent),
            (max_batch, channels, latent, latent),
        ),
        InputProfile(TIMESTEP.name, (1,), (opt,), (max_batch,)),
        InputProfile(
            ENCODER_HIDDEN_STATES.name,
            (1, 77, text_dim),
            (opt, 77, text_dim),
            (max_batch, seq, text_dim),
        ),
    ]


def vae_encoder_profile(max_batch: int, image: int) -> list[InputProfile]:
    return [
        InputProfile(
            PIXELS.name, (1, 3, image, image), (1, 3, image, image), (max_batch, 3, image, image)
        )
    ]


def vae_decoder_profile(max_batch: int, latent: int, channels: int = 4) -> list[InputProfile]:
    one, most = (1, channels, latent, latent), (max_batch, channels, latent, latent)
    return [InputProfile(LATENT.name, one, one, most)]


# ----------------------------------------------------------------------------- host and metadata
@dataclass(frozen=True)
class EngineTarget:
    """What an engine is bound to: TensorRT version and GPU (name, compute capability)."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str


def _tensorrt():
    try:
        import tensorrt
    except ImportError as exc:
        raise TensorRTMissing(
            "the tensorrt Python package is not installed: TensorRT engines are built and "
            "checked on the GPU host that serves them (pip install tensorrt, or run inside "
            "the NGC tritonserver image)"
        ) from exc
    return tensorrt


def current_gpu(device: int = 0) -> tuple[str, str] | None:
    """(name, "major.minor") of GPU ``device`` via NVML or torch; None without a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            return (name.decode() if isinstance(name, bytes) else name), f"{major}.{minor}"
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no pynvml / no driver: try torch
        log.debug("NVML unavailable: %s", exc)
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(device)
            return torch.cuda.get_device_name(device), f"{major}.{minor}"
    except Exception:
        return None
    return None


def host_target(device: int = 0) -> EngineTarget:
    """This host's TensorRT version and GPU; TensorRTMissing / ModelLoadError when absent."""
    trt = _tensorrt()
    gpu = current_gpu(device)
    if gpu is None:
        raise ModelLoadError("no CUDA GPU visible: TensorRT engines need the GPU they run on")
    return EngineTarget(trt.__version__, gpu[0], gpu[1])


def _fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
    digest.update(str(path.stat().st_size).encode())
    return digest.hexdigest()[:16]


def metadata_path(plan: str | Path) -> Path:
    plan = Path(plan)
    return plan.with_name(plan.name + METADATA_SUFFIX)


def write_metadata(
    plan: str | Path, target: EngineTarget, profiles: list[InputProfile], fp16: bool
) -> Path:
    plan = Path(plan)
    meta = {
        **asdict(target),
        "fp16": fp16,
        "profiles": [asdict(p) for p in profiles],
        "plan_bytes": plan.stat().st_size,
        "plan_fingerprint": _fingerprint(plan),
    }
    path = metadata_path(plan)
    path.write_text(json.dumps(meta, indent=2, sort_keys=True))
    return path


def check_engine(plan: str | Path, expected: EngineTarget | None = None) -> dict:
    """Check an engine before it is served; returns its metadata.

    Raises :class:`ModelLoadError` naming the file when the engine is missing, has no (or
    unreadable) metadata, was replaced after its metadata was written, or was built for another
    TensorRT version or GPU than ``expected`` (default: this host, :func:`host_target`)."""
    plan = Path(plan)
    if not plan.is_file():
        raise ModelLoadError(
            f"{plan}: TensorRT engine not found; build it on this GPU host with "
            "`facefuse export --target gpu --precision fp16`"
        )
    meta_file = metadata_path(plan)
    try:
        meta = json.loads(meta_file.read_text())
        built = EngineTarget(
            str(meta["tensorrt_version"]), str(meta["gpu_name"]), str(meta["compute_capability"])
        )
    except FileNotFoundError:
        raise ModelLoadError(
            f"{plan}: engine metadata {meta_file.name} not found; an engine is only served with "
            "the metadata written by `facefuse export --target gpu` (TensorRT version and GPU)"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{meta_file}: unreadable engine metadata ({exc})") from None
    if meta.get("plan_bytes") != plan.stat().st_size or meta.get(
        "plan_fingerprint"
    ) != _fingerprint(plan):
        raise ModelLoadError(
            f"{plan}: the engine does not match its metadata {meta_file.name} (replaced after "
            "the build?); rebuild it with `facefuse export --target gpu`"
        )
    expected = expected or host_target()
    problems = []
    if built.tensorrt_version != expected.tensorrt_version:
        problems.append(
            f"TensorRT {built.tensorrt_version}, this host has {expected.tensorrt_version}"
        )
    if built.compute_capability != expected.compute_capability or built.gpu_name != (
        expected.gpu_name
    ):
        problems.append(
            f"GPU {built.gpu_name} (sm {built.compute_capability}), this host has "
            f"{expected.gpu_name} (sm {expected.compute_capability})"
        )
    if problems:
        raise ModelLoadError(
            f"{plan}: engine built for {'; '.join(problems)}; engines only run on the GPU model "
            "and TensorRT version that built them: rebuild it here with "
            "`facefuse export --target gpu --precision fp16`"
        )
    return meta


# ----------------------------------------------------------------------------- TensorRT build
def build_engine(
    onnx_path: str | Path,
    plan: str | Path,
    profiles: list[InputProfile],
    fp16: bool = True,
    workspace_bytes: int = DEFAULT_WORKSPACE,
) -> Path:
    """Build a TensorRT engine from ``onnx_path`` with one optimisation profile; writes the
    engine and its metadata. Needs tensorrt and a GPU (:class:`TensorRTMissing` otherwise)."""
    trt = _tensorrt()
    target = host_target()
    onnx_path, plan = Path(onnx_path), Path(plan)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):  # implicit in TRT 10
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # reads external data beside the file
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ModelLoadError(f"{onnx_path}: TensorRT could not parse the graph: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    names = {network.get_input(i).name for i in range(network.num_inputs)}
    for p in profiles:
        if p.name not in names:
            raise ValueError(f"{onnx_path}: no input {p.name!r} (inputs: {sorted(names)})")
        profile.set_shape(p.name, p.min, p.opt, p.max)
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ModelLoadError(f"{onnx_path}: TensorRT engine build failed (see the log above)")
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_bytes(bytes(serialized))
    write_metadata(plan, target, profiles, fp16)
    return plan


@dataclass
class GpuExportResult:
    model: str
    path: Path
    kind: str  # "fp16-onnx" | "tensorrt"
    detail: str = ""


def export_gpu_variant(
    repository: str | Path,
    precision: str,
    manifest,
    max_batch: dict[str, int],
    engines: bool = True,
) -> list[GpuExportResult]:
    """FP16 ONNX for every FP16 model and, when ``engines``, a TensorRT engine for the UNet."""

    if precision == "fp32":
        return []
    if precision != "fp16":
        raise ValueError(f"--target gpu builds fp32 and fp16 variants, not {precision!r}")
    root = Path(repository)
    results = []
    for model in VARIANT_MODELS["fp16"]:
        folder = root / model / "1"
        conversion = convert_fp16(folder / "model.onnx", folder / onnx_file("fp16"))
        results.append(
            GpuExportResult(model, conversion.path, "fp16-onnx", f"{conversion.bytes / 1e6:.1f} MB")
        )
    if engines:
        profiles = unet_profile(
            max_batch.get("unet", 16),
            manifest.latent_size,
            manifest.text_dim,
            manifest.latent_channels,
        )
        plan = build_engine(
            root / "unet" / "1" / "model.onnx", root / "unet" / "1" / PLAN_FILE, profiles
        )
        results.append(GpuExportResult("unet", plan, "tensorrt", "fp16, batch 1..N"))
    return results
