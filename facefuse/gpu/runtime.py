"""PyTorch runtime for the Python-backend models (``runtime: torch-cuda`` in a model config).

The CPU default stays ONNX Runtime (:mod:`facefuse.runtime`). On a GPU the ``unet``,
``vae_encoder``, ``vae_decoder`` and ``text_encoder`` models can instead run the diffusers /
transformers PyTorch modules in FP16 on the GPU, each batch size replayed from a CUDA graph
captured at load (:class:`GraphRunner`): a forward of ``b`` rows is padded up to the next
captured batch size, so the batches that dynamic batching forms always hit a graph.

:class:`TorchSession` mimics the two methods of an ``onnxruntime.InferenceSession`` that the
serving base class uses (``run(output_names, feeds)`` and ``get_inputs()``), so batching, shape
checks, error responses and metrics stay those of
:class:`facefuse.serving.triton_onnx.OnnxTritonModel`.

Failures are loud or logged, never silent:
- an unknown ``runtime`` is a :class:`ModelLoadError` naming the valid ones;
- ``torch-cuda`` on a host without CUDA is a :class:`ModelLoadError`, unless the config sets
  ``cuda_fallback: cpu`` (then a logged warning, FP32 eager on the CPU);
- a CUDA graph whose capture fails, or whose replay differs from the eager forward on the
  capture input, is dropped with a logged warning and that batch size runs eager
  (:attr:`GraphRunner.fallbacks` records why).

Tensors cross model boundaries as host numpy arrays (the Python backend's CPU tensors): the
latents of one UNet call are 2x4x64x64 floats (128 KiB), a copy per call costs well under a
millisecond next to the forward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from facefuse.core.errors import ModelLoadError
from facefuse.runtime.openvino import AUTO

log = logging.getLogger("facefuse.gpu")

ONNX_RUNTIME = "onnxruntime"
OPENVINO = "openvino"  # CPU, the exported ONNX graph (facefuse.runtime.openvino)
# AUTO: OpenVINO bf16 for a large graph where the CPU computes bf16 natively, ONNX Runtime
# elsewhere (facefuse.runtime.openvino.resolve_auto)
RUNTIMES = (ONNX_RUNTIME, OPENVINO, AUTO, "torch-cuda", "torch-cpu")
KINDS = ("unet", "vae_encoder", "vae_decoder", "text_encoder")
DTYPES = ("float16", "float32", "bfloat16")
DEFAULT_GRAPH_BATCHES = (1, 2, 4, 8, 16)
SEEDED_PREFIX = "seeded:"
# replay vs eager on the capture input: relative max-abs difference allowed (same kernels,
# so normally 0; a little slack for non-deterministic reductions)
GRAPH_TOLERANCE = 1e-2


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class TorchSettings:
    """What a model config asks of the torch runtime (its ``parameters``)."""

    runtime: str = "torch-cuda"
    device: str = "cuda"
    dtype: str = "float16"
    cuda_graphs: bool = True
    graph_batches: tuple[int, ...] = DEFAULT_GRAPH_BATCHES
    channels_last: bool = False
    cuda_fallback: str = "error"  # "error" | "cpu"
    model_dir: str = ""
    seed: int = 0
    warm_shapes: tuple[tuple[int, ...], ...] = field(default_factory=tuple)


def _flag(raw: str, key: str, model: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ModelLoadError(f"{model}: parameter {key} must be true or false, got {raw!r}")
    return value in ("true", "1", "yes")


def _batches(raw: str, model: str, max_batch: int | None) -> tuple[int, ...]:
    try:
        sizes = sorted({int(part) for part in raw.replace(" ", "").split(",") if part})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise ModelLoadError(
            f"{model}: parameter graph_batch_sizes must list batch sizes >= 1 such as "
            f"'1,2,4,8,16', got {raw!r}"
        )
    if max_batch and sizes[-1] < max_batch:
        sizes.append(max_batch)  # every batch the batcher may form has a graph to pad up to
    return tuple(s for s in sizes if not max_batch or s <= max_batch)


def runtime_of(params: dict[str, str], model: str) -> str:
    """The config's ``runtime`` parameter (default ONNX Runtime), checked."""
    runtime = params.get("runtime", ONNX_RUNTIME).strip().lower()
    if runtime not in RUNTIMES:
        raise ModelLoadError(
            f"{model}: parameter runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}"
        )
    return runtime


def settings_from(params: dict[str, str], model: str, max_batch: int | None) -> TorchSettings:
    """:class:`TorchSettings` from a model config's parameters; ModelLoadError names the bad one."""
    runtime = runtime_of(params, model)
    if runtime in (ONNX_RUNTIME, OPENVINO, AUTO):
        raise ModelLoadError(f"{model}: runtime {runtime!r} is not a torch runtime")
    cpu = runtime == "torch-cpu"
    dtype = params.get("dtype", "float32" if cpu else "float16").strip().lower()
    if dtype not in DTYPES:
        raise ModelLoadError(f"{model}: parameter dtype must be one of {DTYPES}, got {dtype!r}")
    fallback = params.get("cuda_fallback", "error").strip().lower()
    if fallback not in ("error", "cpu"):
        raise ModelLoadError(f"{model}: parameter cuda_fallback must be error or cpu")
    try:
        seed = int(params.get("seed", "0"))
    except ValueError as exc:
        raise ModelLoadError(f"{model}: parameter seed must be an integer") from exc
    return TorchSettings(
        runtime=runtime,
        device="cpu" if cpu else params.get("device", "cuda").strip(),
        dtype=dtype,
        cuda_graphs=not cpu and _flag(params.get("cuda_graphs", "true"), "cuda_graphs", model),
        graph_batches=_batches(params.get("graph_batch_sizes", "1,2,4,8,16"), model, max_batch),
        channels_last=_flag(params.get("channels_last", "false"), "channels_last", model),
        cuda_fallback=fallback,
        model_dir=params.get("model_dir", "").strip(),
        seed=seed,
    )


def resolve_device(settings: TorchSettings, model: str = "model"):
    """(torch.device, dtype, settings actually used): CUDA checked, fallback logged."""
    import torch

    try:
        device = torch.device(settings.device)
    except RuntimeError as exc:
        raise ModelLoadError(f"{model}: parameter device {settings.device!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        if settings.cuda_fallback != "cpu":
            raise ModelLoadError(
                f"{model}: runtime {settings.runtime} needs a CUDA GPU but torch "
                f"{torch.__version__} sees none (torch.cuda.is_available() is False); use "
                "runtime onnxruntime or torch-cpu, or set cuda_fallback: cpu"
            )
        log.warning(
            "%s: no CUDA device visible to torch %s: falling back to FP32 eager on the CPU "
            "(cuda_fallback: cpu)",
            model,
            torch.__version__,
        )
        from dataclasses import replace

        settings = replace(
            settings, runtime="torch-cpu", device="cpu", dtype="float32", cuda_graphs=False
        )
        device = torch.device("cpu")
    if device.type != "cuda" and settings.cuda_graphs:
        from dataclasses import replace

        log.info("%s: CUDA graphs need a CUDA device; %s runs eager", model, device)
        settings = replace(settings, cuda_graphs=False)
    return device, getattr(torch, settings.dtype), settings


# ----------------------------------------------------------------------------- modules
def build_modules(model_dir: str, kinds: Sequence[str], device, seed: int = 0) -> dict:
    """The torch modules for ``kinds`` (fp32, on ``device``, eval mode).

    ``model_dir``: a diffusers SD 1.x folder, or ``seeded:<shape>`` (``sd15``, ``mid``,
    ``tiny``) to build seeded random weights directly on ``device`` (no file, fast on a GPU)."""
    import torch

    from facefuse.models.tiny import NAMED_SHAPES, SD15, build_text_encoder, build_unet, build_vae

    builders = {
        "unet": build_unet,
        "vae": build_vae,
        "text_encoder": build_text_encoder,
    }
    wanted = {"vae" if k.startswith("vae") else k for k in kinds}
    if model_dir.startswith(SEEDED_PREFIX):
        name = model_dir[len(SEEDED_PREFIX) :]
        shapes = {"sd15": SD15, **NAMED_SHAPES}
        if name not in shapes:
            raise ModelLoadError(
                f"model_dir {model_dir!r}: seeded shapes are {', '.join(sorted(shapes))}"
            )
        modules = {}
        with torch.device(device):  # weights initialised where they run
            for part in sorted(wanted):
                modules[part] = builders[part](shapes[name], seed).eval()
        return modules
    if not model_dir:
        raise ModelLoadError(
            "parameter model_dir is required by the torch runtime: a diffusers SD 1.x folder "
            "or seeded:<sd15|mid|tiny>"
        )
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    from facefuse.models.loading import resolve_model

    folder = resolve_model(model_dir)
    loaders = {
        "unet": lambda: UNet2DConditionModel.from_pretrained(folder / "unet", use_safetensors=True),
        "vae": lambda: AutoencoderKL.from_pretrained(folder / "vae", use_safetensors=True),
        "text_encoder": lambda: CLIPTextModel.from_pretrained(
            folder / "text_encoder", use_safetensors=True
        ),
    }
    return {part: loaders[part]().eval().to(device) for part in sorted(wanted)}


@dataclass(frozen=True)
class KindSpec:
    """One served model: its inputs (name, dtype kind, shape with symbols) and outputs."""

    inputs: tuple[tuple[str, str, tuple], ...]
    outputs: tuple[str, ...]


SPECS = {
    "unet": KindSpec(
        (
            ("sample", "float", ("batch", 4, "height", "width")),
            ("timestep", "float", ("batch",)),
            ("encoder_hidden_states", "float", ("batch", "sequence", "hidden")),
        ),
        ("noise_pred",),
    ),
    "vae_encoder": KindSpec((("image", "float", ("batch", 3, "height", "width")),), ("latent",)),
    "vae_decoder": KindSpec((("latent", "float", ("batch", 4, "height", "width")),), ("image",)),
    "text_encoder": KindSpec(
        (("input_ids", "int64", ("batch", 77)),), ("last_hidden_state", "pooled")
    ),
}


def forward_fn(kind: str, modules: dict) -> Callable:
    """``f(*tensors) -> tuple of tensors`` for ``kind`` (the ONNX export's semantics)."""
    if kind == "unet":
        unet = modules["unet"]

        def f(sample, timestep, context):
            return (unet(sample, timestep, context, return_dict=False)[0],)

    elif kind == "vae_encoder":
        vae = modules["vae"]

        def f(image):  # pixels in [-1, 1] -> scaled latent mean (deterministic)
            return (vae.encode(image).latent_dist.mean * vae.config.scaling_factor,)

    elif kind == "vae_decoder":
        vae = modules["vae"]

        def f(latent):
            return (vae.decode(latent / vae.config.scaling_factor, return_dict=False)[0],)

    elif kind == "text_encoder":
        text = modules["text_encoder"]

        def f(input_ids):
            out = text(input_ids=input_ids, return_dict=True)
            return out.last_hidden_state, out.pooler_output

    else:
        raise ModelLoadError(f"torch runtime serves {', '.join(KINDS)}, not {kind!r}")
    return f


# ----------------------------------------------------------------------------- CUDA graphs
class GraphRunner:
    """``runner(*tensors)``: replay a CUDA graph captured for the next batch size up.

    Graphs are keyed by (padded batch, non-batch shapes of every input) and captured on first
    use or by :meth:`capture`; all share one memory pool. Inputs are copied into the graph's
    static buffers (rows past ``b`` are zeros), outputs sliced back to ``b`` rows and cloned.
    A batch over the largest size, a device that is not CUDA or ``enabled=False`` run eager.
    """

    def __init__(
        self,
        fn: Callable,
        batches: Sequence[int] = DEFAULT_GRAPH_BATCHES,
        enabled: bool = True,
        name: str = "model",
        validate: bool = True,
        pool=None,
    ):
        self.fn, self.name, self.validate = fn, name, validate
        self.batches = tuple(sorted(set(batches)))
        self.enabled = enabled
        self.graphs: dict[tuple, tuple] = {}
        self.fallbacks: dict[tuple, str] = {}  # key -> why it runs eager
        self.replays = self.eager_runs = 0
        self._pool = pool

    def bucket(self, rows: int) -> int | None:
        return next((b for b in self.batches if b >= rows), None)

    @staticmethod
    def _key(padded: int, tensors) -> tuple:
        return (padded, *((tuple(t.shape[1:]), str(t.dtype)) for t in tensors))

    def _eager(self, tensors):
        import torch

        self.eager_runs += 1
        with torch.inference_mode():
            return tuple(self.fn(*tensors))

    def __call__(self, *tensors):
        rows = tensors[0].shape[0]
        padded = self.bucket(rows) if self.enabled and tensors[0].is_cuda else None
        if padded is None:
            return self._eager(tensors)
        key = self._key(padded, tensors)
        if key not in self.graphs and key not in self.fallbacks:
            self._capture(key, padded, tensors)
        if key in self.fallbacks:
            return self._eager(tensors)
        graph, static_in, static_out = self.graphs[key]
        import torch

        with torch.inference_mode():
            for buffer, tensor in zip(static_in, tensors):
                buffer[:rows].copy_(tensor)
                if rows < padded:
                    buffer[rows:].zero_()
            graph.replay()
            self.replays += 1
            return tuple(out[:rows].clone() for out in static_out)

    def capture(self, example: Sequence) -> None:
        """Capture a graph for every batch size, with ``example`` (any batch) as the template."""
        for padded in self.batches:
            tensors = [_resize_rows(t, padded) for t in example]
            key = self._key(padded, tensors)
            if key not in self.graphs and key not in self.fallbacks:
                self._capture(key, padded, tensors)

    def _capture(self, key: tuple, padded: int, tensors) -> None:
        import torch

        static_in = [_resize_rows(t, padded).clone() for t in tensors]
        try:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.inference_mode():
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up: cuDNN/cuBLAS choices, lazy allocations
                        expected = tuple(self.fn(*static_in))
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool):
                    static_out = tuple(self.fn(*static_in))
                graph.replay()
                torch.cuda.synchronize()
                if self.validate:
                    for got, want in zip(static_out, expected):
                        scale = float(want.float().abs().max()) or 1.0
                        diff = float((got.float() - want.float()).abs().max())
                        if not diff <= GRAPH_TOLERANCE * scale:  # also catches NaN
                            raise RuntimeError(
                                f"graph replay differs from eager (max|diff| {diff:.3g}, "
                                f"scale {scale:.3g})"
                            )
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            self.fallbacks[key] = reason
            log.warning(
                "%s: CUDA graph for batch %d not used, running eager (%s)",
                self.name,
                padded,
                reason,
            )
            try:
                torch.cuda.synchronize()
            except Exception:
                log.exception("%s: CUDA synchronize after a failed capture", self.name)
            return
        self.graphs[key] = (graph, static_in, static_out)

    def status(self) -> dict:
        return {
            "graphs": sorted(k[0] for k in self.graphs),
            "fallbacks": {str(k[0]): why for k, why in self.fallbacks.items()},
            "replays": self.replays,
            "eager_runs": self.eager_runs,
        }


def _resize_rows(tensor, rows: int):
    """``tensor`` with ``rows`` rows: cut, or repeated cyclically (a realistic capture input)."""
    import torch

    have = tensor.shape[0]
    if have == rows:
        return tensor
    if have > rows:
        return tensor[:rows]
    reps = -(-rows // have)
    return torch.cat([tensor] * reps)[:rows]


# ----------------------------------------------------------------------------- session
@dataclass(frozen=True)
class _InputInfo:
    name: str
    shape: list


class TorchSession:
    """An ``onnxruntime.InferenceSession`` look-alike over a torch module (see module doc)."""

    def __init__(self, kind: str, modules: dict, device, dtype, settings: TorchSettings):
        import torch

        if kind not in SPECS:
            raise ModelLoadError(f"torch runtime serves {', '.join(KINDS)}, not {kind!r}")
        self.kind, self.device, self.dtype, self.settings = kind, device, dtype, settings
        for module in modules.values():
            module.to(device=device, dtype=dtype)
            if settings.channels_last and kind != "text_encoder":
                module.to(memory_format=torch.channels_last)
        self.modules = modules
        self.spec = SPECS[kind]
        self.runner = GraphRunner(
            forward_fn(kind, modules),
            settings.graph_batches,
            enabled=settings.cuda_graphs,
            name=kind,
        )

    # ORT's interface ----------------------------------------------------------------
    def get_inputs(self) -> list[_InputInfo]:
        return [_InputInfo(name, list(shape)) for name, _, shape in self.spec.inputs]

    def run(self, output_names, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        tensors = self.to_tensors(feeds)
        outputs = self.runner(*tensors)
        wanted = self.spec.outputs if not output_names else output_names
        index = {name: i for i, name in enumerate(self.spec.outputs)}
        missing = [n for n in wanted if n not in index]
        if missing:
            raise KeyError(f"{self.kind}: no output {missing} (outputs: {self.spec.outputs})")
        return [outputs[index[n]].float().cpu().numpy() for n in wanted]

    # helpers -------------------------------------------------------------------------
    def to_tensors(self, feeds: dict[str, np.ndarray]) -> list:
        import torch

        tensors = []
        for name, kind, _ in self.spec.inputs:
            array = feeds[name]
            if kind == "int64":
                tensors.append(torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)))
            else:
                tensors.append(torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)))
        non_blocking = self.device.type == "cuda"
        return [
            t.to(self.device, non_blocking=non_blocking)
            if t.dtype == torch.int64
            else t.to(self.device, self.dtype, non_blocking=non_blocking)
            for t in tensors
        ]

    def warm_up(self, example: dict[str, np.ndarray]) -> dict:
        """Capture every graph batch size for ``example``'s shapes (or run it once eager)."""
        tensors = self.to_tensors(example)
        if self.runner.enabled:
            self.runner.capture(tensors)
        else:
            self.runner(*tensors)
        return self.runner.status()


def example_feeds(kind: str, latent: int, text_dim: int, vae_factor: int = 8) -> dict:
    """One-row inputs of the served shapes, for warm-up and graph capture."""
    rng = np.random.default_rng(0)
    if kind == "unet":
        return {
            "sample": rng.standard_normal((1, 4, latent, latent)).astype(np.float32),
            "timestep": np.array([500.0], dtype=np.float32),
            "encoder_hidden_states": rng.standard_normal((1, 77, text_dim)).astype(np.float32),
        }
    if kind == "vae_encoder":
        side = latent * vae_factor
        return {"image": rng.uniform(-1, 1, (1, 3, side, side)).astype(np.float32)}
    if kind == "vae_decoder":
        return {"latent": rng.standard_normal((1, 4, latent, latent)).astype(np.float32)}
    ids = np.full((1, 77), 49407, dtype=np.int64)
    ids[0, 0] = 49406
    return {"input_ids": ids}


def open_torch_session(
    kind: str,
    params: dict[str, str],
    model: str,
    version_dir: str | Path,
    max_batch: int | None,
) -> TorchSession:
    """What ``OnnxTritonModel.initialize`` opens instead of an ORT session for a torch runtime.

    Builds or loads the module, moves it to the device and dtype, and captures the CUDA graphs
    for the served shapes (``warm_latent`` / latent side of the module's config)."""
    settings = settings_from(params, model, max_batch)
    device, dtype, settings = resolve_device(settings, model)
    if device.type == "cuda" and _flag(
        params.get("cudnn_benchmark", "true"), "cudnn_benchmark", model
    ):
        import torch

        # shapes are fixed per captured graph: let cuDNN pick its fastest kernels during the
        # warm-up forwards that precede each capture
        torch.backends.cudnn.benchmark = True
    model_dir = settings.model_dir
    if model_dir and not model_dir.startswith(SEEDED_PREFIX) and not Path(model_dir).is_absolute():
        model_dir = str(Path(version_dir) / model_dir)
    modules = build_modules(model_dir, [kind], device, settings.seed)
    session = TorchSession(kind, modules, device, dtype, settings)
    if params.get("warm_up", "true").strip().lower() != "false":
        latent, text_dim = _served_sizes(modules, params)
        status = session.warm_up(example_feeds(kind, latent, text_dim))
        log.warning(
            "%s: torch runtime %s %s on %s, CUDA graphs %s",
            model,
            settings.runtime,
            settings.dtype,
            device,
            status if settings.cuda_graphs else "off",
        )
    return session


def _served_sizes(modules: dict, params: dict[str, str]) -> tuple[int, int]:
    latent = 64
    if "warm_latent" in params:
        latent = int(params["warm_latent"])
    elif "unet" in modules:
        latent = int(modules["unet"].config.sample_size)
    elif "vae" in modules:
        vae = modules["vae"]
        factor = 2 ** (len(vae.config.block_out_channels) - 1)
        latent = int(vae.config.sample_size) // factor
    text_dim = 768
    if "unet" in modules:
        text_dim = int(modules["unet"].config.cross_attention_dim)
    elif "text_encoder" in modules:
        text_dim = int(modules["text_encoder"].config.hidden_size)
    return latent, text_dim


def torch_kind(inputs: Sequence[str]) -> str:
    """The :data:`KINDS` entry of a serving model from its first input's name."""
    first = {"sample": "unet", "image": "vae_encoder", "latent": "vae_decoder"}
    name = inputs[0] if inputs else ""
    kind = first.get(name, "text_encoder" if name.lower() == "input_ids" else None)
    if kind is None:
        raise ModelLoadError(f"no torch runtime for a model with inputs {list(inputs)}")
    return kind
