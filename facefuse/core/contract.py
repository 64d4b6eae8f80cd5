"""The tensor contract of every Triton model, written once.

Each :class:`Tensor` says a name, a Triton dtype, its dims (without the batch dimension of a
model with ``max_batch_size`` > 0), whether it is optional, its default and its range; each
:class:`Model` lists its inputs and outputs. The Triton ``model.py`` stubs, the config
generator (``facefuse.export.configs``), the client, Locust, the perf_analyzer input files,
the soak script and the benches all read names from here, and build a facefusion or txt2img
request with :func:`facefusion_request` / :func:`txt2img_request`.

Latent channel dims are -1 (variable): the SD 1.x VAE has 4 latent channels, other VAEs more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from facefuse.core.limits import (
    DEFAULT_LIMITS,
    check_fusion_instruction,
    check_instruction,
    check_params,
)

NUMPY_DTYPES = {
    "BYTES": np.object_,
    "UINT8": np.uint8,
    "BOOL": np.bool_,
    "FP64": np.float64,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP32": np.float32,
}


@dataclass(frozen=True)
class Tensor:
    """One named tensor of a model's signature."""

    name: str
    dtype: str  # Triton dtype as clients spell it: BYTES, INT32, INT64, FP32, UINT8, ...
    dims: tuple[int, ...]  # -1: variable; no batch dimension
    optional: bool = False
    default: int | float | None = None
    range: tuple[int | float, int | float] | None = None  # inclusive bounds of a scalar
    doc: str = ""

    def __post_init__(self) -> None:
        if self.dtype not in NUMPY_DTYPES:
            raise ValueError(f"{self.name}: dtype {self.dtype!r} not in {sorted(NUMPY_DTYPES)}")
        if self.default is not None and not self.optional:
            raise ValueError(f"{self.name}: only an optional tensor has a default")

    @property
    def numpy_dtype(self) -> type:
        return NUMPY_DTYPES[self.dtype]

    @property
    def config_dtype(self) -> str:
        """The ``data_type`` of a config.pbtxt (``TYPE_STRING`` for BYTES)."""
        return "TYPE_STRING" if self.dtype == "BYTES" else f"TYPE_{self.dtype}"

    def scalar(self, value) -> np.ndarray:
        """A one-element tensor (shape [1]) of this dtype; text is UTF-8 encoded."""
        if self.dtype == "BYTES" and isinstance(value, str):
            value = value.encode("utf-8")
        return np.array([value], dtype=self.numpy_dtype)


@dataclass(frozen=True)
class Model:
    """A Triton model's name, signature and batching."""

    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    max_batch_size: int = 0

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    def tensor(self, name: str) -> Tensor:
        for tensor in self.inputs + self.outputs:
            if tensor.name == name:
                return tensor
        raise KeyError(f"{self.name} has no tensor {name!r}")


_L = DEFAULT_LIMITS

# --- request fields of the pipelines ----------------------------------------------------------
SOURCE_IMAGE = Tensor("SOURCE_IMAGE", "BYTES", (1,), doc="face A: PNG, JPEG or WebP bytes")
TARGET_IMAGE = Tensor("TARGET_IMAGE", "BYTES", (1,), doc="image B: PNG, JPEG or WebP bytes")
INSTRUCTION = Tensor(
    "INSTRUCTION", "BYTES", (1,), doc="what to do, UTF-8; empty: a plain swap (prompt.plain)"
)
PROMPT = Tensor("PROMPT", "BYTES", (1,), doc="txt2img prompt, UTF-8")
STEPS = Tensor("STEPS", "INT32", (1,), True, 20, (_L.min_steps, _L.max_steps))
STRENGTH = Tensor("STRENGTH", "FP32", (1,), True, 0.5, (_L.min_strength, _L.max_strength))
GUIDANCE = Tensor("GUIDANCE", "FP32", (1,), True, 7.5, (_L.min_guidance, _L.max_guidance))
SEED = Tensor("SEED", "INT64", (1,), True, 0, (0, _L.max_seed))
# expression (issue 30): whose expression the fused face wears and the edits on top of it
# (facefuse.face.expression_edit); absent fields keep B's expression with the instruction's edits
EXPRESSION_SOURCES = ("target", "source")
EXPRESSION_SOURCE = Tensor(
    "EXPRESSION_SOURCE", "BYTES", (1,), True,
    doc='whose expression: "target" (B\'s, the default) or "source" (A\'s own)',
)  # fmt: skip
EXPRESSION_SMILE = Tensor(
    "EXPRESSION_SMILE", "FP32", (1,), True, None, (-1.0, 2.0),
    doc="added to the chosen expression's smile (1.0: an average smile; overrides the words)",
)  # fmt: skip
EXPRESSION_MOUTH_OPEN = Tensor(
    "EXPRESSION_MOUTH_OPEN", "FP32", (1,), True, None, (0.0, 1.0),
    doc="added lip parting (1.0: 0.25 eye spans; overrides the words)",
)  # fmt: skip
# which faces of B (several people in the photo): FaceFusion's face selector
FACE_SELECTS = ("largest", "all", "reference")
FACE_SELECT = Tensor(
    "FACE_SELECT", "BYTES", (1,), True,
    doc='"largest" (default), "all", or "reference" (default when REFERENCE_FACE is sent)',
)  # fmt: skip
REFERENCE_FACE = Tensor(
    "REFERENCE_FACE", "BYTES", (1,), True,
    doc="a photo of the person in B to fuse (PNG, JPEG or WebP): the face most like it",
)  # fmt: skip
IMAGE = Tensor("IMAGE", "BYTES", (1,), doc="the result as PNG bytes")
INFO = Tensor("INFO", "BYTES", (1,), doc="JSON: tokens, cache hits, steps, per-stage ms")

# --- prompt_optimizer ---------------------------------------------------------------------------
OVERFLOW = Tensor("OVERFLOW", "BYTES", (1,), optional=True)
NEGATIVE_PROMPT = Tensor("NEGATIVE_PROMPT", "BYTES", (1,), optional=True)
PROMPT_IDS = Tensor("PROMPT_IDS", "INT64", (-1, 77))
NEGATIVE_IDS = Tensor("NEGATIVE_IDS", "INT64", (-1, 77))

# --- text_encoder ---------------------------------------------------------------------------
INPUT_IDS = Tensor("INPUT_IDS", "INT64", (77,))
LAST_HIDDEN_STATE = Tensor("LAST_HIDDEN_STATE", "FP32", (77, -1))
POOLED = Tensor("POOLED", "FP32", (-1,))
CACHE_HIT_TOKENS = Tensor("CACHE_HIT_TOKENS", "INT32", (1,))

# --- face_analyzer ------------------------------------------------------------------------------
SIZE = Tensor("SIZE", "INT32", (1,), doc="working size in pixels")
COMPOSITE = Tensor("COMPOSITE", "FP32", (-1, -1, 3))
MASK = Tensor("MASK", "FP32", (-1, -1))
CROP_BOX = Tensor("CROP_BOX", "INT64", (4,))
EXPRESSION = Tensor(
    "EXPRESSION", "BYTES", (1,), True,
    doc="JSON of facefuse.face.expression_edit.ExpressionEdit; absent: A's face as it is",
)  # fmt: skip

# --- ONNX-serving models: the names are the exported graphs' own ------------------------------
SAMPLE = Tensor("sample", "FP32", (-1, -1, -1))  # latent channels, height, width
TIMESTEP = Tensor("timestep", "FP32", (1,))
ENCODER_HIDDEN_STATES = Tensor("encoder_hidden_states", "FP32", (-1, -1))
NOISE_PRED = Tensor("noise_pred", "FP32", (-1, -1, -1))
# DeepCache (facefuse.models.deepcache): the input of the UNet's last up layer besides conv_in
DEEP = Tensor("deep", "FP32", (-1, -1, -1))
PIXELS = Tensor("image", "FP32", (3, -1, -1))
LATENT = Tensor("latent", "FP32", (-1, -1, -1))

FACEFUSION = Model(
    "facefusion",
    (
        SOURCE_IMAGE, TARGET_IMAGE, INSTRUCTION, STEPS, STRENGTH, GUIDANCE, SEED,
        EXPRESSION_SOURCE, EXPRESSION_SMILE, EXPRESSION_MOUTH_OPEN, FACE_SELECT, REFERENCE_FACE,
    ),
    (IMAGE, INFO),
)  # fmt: skip
# facefusion_stream: one video or camera stream per correlation id (sequence_id with
# sequence_start / sequence_end); the START request carries A and the options, every request
# may carry one frame, raw (FRAME) or JPEG (FRAME_JPEG), answered in the same form
STREAM_SOURCE_IMAGE = Tensor(
    "SOURCE_IMAGE", "BYTES", (1,), optional=True, doc="A's photo, at the stream's START"
)
STREAM_INSTRUCTION = Tensor(
    "INSTRUCTION", "BYTES", (1,), optional=True, doc="at START; empty or absent: a plain swap"
)
FRAME = Tensor("FRAME", "UINT8", (-1, -1, 3), optional=True, doc="one RGB frame, raw")
FRAME_JPEG = Tensor("FRAME_JPEG", "BYTES", (1,), optional=True, doc="one frame as JPEG")
FRAME_TIME = Tensor("FRAME_TIME", "FP64", (1,), optional=True, doc="the frame's time, seconds")
LIVE = Tensor("LIVE", "BOOL", (1,), optional=True, doc="at START: the newest frame wins")
FRAME_OUT = Tensor("FRAME", "UINT8", (-1, -1, 3), doc="the fused frame, raw")
FRAME_JPEG_OUT = Tensor("FRAME_JPEG", "BYTES", (1,), doc="the fused frame as JPEG")
FACEFUSION_STREAM = Model(
    "facefusion_stream",
    (
        STREAM_SOURCE_IMAGE, STREAM_INSTRUCTION, STEPS, STRENGTH, GUIDANCE, EXPRESSION_SOURCE,
        EXPRESSION_SMILE, EXPRESSION_MOUTH_OPEN, FACE_SELECT, LIVE, FRAME, FRAME_JPEG, FRAME_TIME,
    ),
    (FRAME_OUT, FRAME_JPEG_OUT, INFO),
)  # fmt: skip
TXT2IMG = Model("txt2img", (PROMPT, STEPS, GUIDANCE, SEED), (IMAGE, INFO))
PROMPT_OPTIMIZER = Model(
    "prompt_optimizer",
    (INSTRUCTION, OVERFLOW, NEGATIVE_PROMPT),
    (PROMPT_IDS, NEGATIVE_IDS, INFO),
)
TEXT_ENCODER = Model(
    "text_encoder", (INPUT_IDS,), (LAST_HIDDEN_STATE, POOLED, CACHE_HIT_TOKENS), max_batch_size=16
)
FACE_ANALYZER = Model(
    "face_analyzer",
    (SOURCE_IMAGE, TARGET_IMAGE, SIZE, EXPRESSION, REFERENCE_FACE),
    (COMPOSITE, MASK, CROP_BOX, INFO),
)
UNET = Model("unet", (SAMPLE, TIMESTEP, ENCODER_HIDDEN_STATES), (NOISE_PRED,), max_batch_size=16)
UNET_DEEP = Model(
    "unet_deep", (SAMPLE, TIMESTEP, ENCODER_HIDDEN_STATES), (NOISE_PRED, DEEP), max_batch_size=16
)
UNET_SHALLOW = Model(
    "unet_shallow",
    (SAMPLE, TIMESTEP, ENCODER_HIDDEN_STATES, DEEP),
    (NOISE_PRED,),
    max_batch_size=16,
)
VAE_ENCODER = Model("vae_encoder", (PIXELS,), (LATENT,), max_batch_size=4)
VAE_DECODER = Model("vae_decoder", (LATENT,), (PIXELS,), max_batch_size=4)

MODELS = {
    m.name: m
    for m in (
        FACEFUSION,
        FACEFUSION_STREAM,
        TXT2IMG,
        PROMPT_OPTIMIZER,
        TEXT_ENCODER,
        FACE_ANALYZER,
        UNET,
        UNET_DEEP,
        UNET_SHALLOW,
        VAE_ENCODER,
        VAE_DECODER,
    )
}


def _params(model: Model, **values) -> dict[str, np.ndarray]:
    """The optional scalars that are given, validated together with the defaults of the rest."""
    check_params(
        *(
            model_default if (v := values.get(name)) is None else v
            for name, model_default in (
                ("steps", STEPS.default),
                ("strength", STRENGTH.default),
                ("guidance", GUIDANCE.default),
                ("seed", SEED.default),
            )
        )
    )
    tensors = {}
    for tensor in model.inputs:
        value = values.get(tensor.name.lower())
        if tensor.optional and value is not None:
            tensors[tensor.name] = tensor.scalar(value)
    return tensors


def check_expression_inputs(
    source: str | None, smile: float | None, mouth_open: float | None
) -> None:
    """InvalidInput naming the first expression field out of its range (absent: None)."""
    from facefuse.core.errors import InvalidInput

    if source is not None and source not in EXPRESSION_SOURCES:
        raise InvalidInput(
            EXPRESSION_SOURCE.name, f"must be one of {list(EXPRESSION_SOURCES)}, got {source!r}"
        )
    for tensor, value in ((EXPRESSION_SMILE, smile), (EXPRESSION_MOUTH_OPEN, mouth_open)):
        if value is None:
            continue
        low, high = tensor.range
        if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
            raise InvalidInput(tensor.name, f"must be a number in [{low}, {high}], got {value!r}")


def check_face_select(select: str | None, has_reference: bool) -> str:
    """The face selection a request asks for (absent: "reference" with a REFERENCE_FACE,
    else "largest"); InvalidInput naming the field."""
    from facefuse.core.errors import InvalidInput

    if select is None:
        return "reference" if has_reference else "largest"
    if select not in FACE_SELECTS:
        raise InvalidInput(FACE_SELECT.name, f"must be one of {list(FACE_SELECTS)}, got {select!r}")
    if select == "reference" and not has_reference:
        raise InvalidInput(REFERENCE_FACE.name, 'is required when FACE_SELECT is "reference"')
    return select


def facefusion_request(
    source: bytes,
    target: bytes,
    instruction: str,
    steps: int | None = None,
    strength: float | None = None,
    guidance: float | None = None,
    seed: int | None = None,
    expression_source: str | None = None,
    expression_smile: float | None = None,
    expression_mouth_open: float | None = None,
    face_select: str | None = None,
    reference_face: bytes | None = None,
) -> dict[str, np.ndarray]:
    """name -> array of one ``facefusion`` request, validated as the server validates it.

    Absent parameters are not sent (the server applies the defaults of this contract)."""
    tensors = {
        SOURCE_IMAGE.name: SOURCE_IMAGE.scalar(source),
        TARGET_IMAGE.name: TARGET_IMAGE.scalar(target),
        INSTRUCTION.name: INSTRUCTION.scalar(
            check_fusion_instruction(instruction, INSTRUCTION.name)
        ),
    }
    tensors.update(
        _params(FACEFUSION, steps=steps, strength=strength, guidance=guidance, seed=seed)
    )
    check_expression_inputs(expression_source, expression_smile, expression_mouth_open)
    check_face_select(face_select, reference_face is not None)
    for tensor, value in (
        (EXPRESSION_SOURCE, expression_source),
        (EXPRESSION_SMILE, expression_smile),
        (EXPRESSION_MOUTH_OPEN, expression_mouth_open),
        (FACE_SELECT, face_select),
        (REFERENCE_FACE, reference_face),
    ):
        if value is not None:
            tensors[tensor.name] = tensor.scalar(value)
    return tensors


def txt2img_request(
    prompt: str,
    steps: int | None = None,
    guidance: float | None = None,
    seed: int | None = None,
) -> dict[str, np.ndarray]:
    """name -> array of one ``txt2img`` request, validated as the server validates it."""
    tensors = {PROMPT.name: PROMPT.scalar(check_instruction(prompt, PROMPT.name))}
    tensors.update(_params(TXT2IMG, steps=steps, guidance=guidance, seed=seed))
    return tensors


def triton_dtype(model: Model, name: str) -> str:
    """The Triton dtype a client declares for input ``name`` of ``model``."""
    return model.tensor(name).dtype


def infer_inputs(module, model: Model, arrays: dict[str, np.ndarray]) -> list:
    """tritonclient ``InferInput`` objects for ``arrays`` (``module``: tritonclient.http,
    tritonclient.grpc or their aio variants; passed in so that core imports no client)."""
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), triton_dtype(model, name))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def requested_outputs(module, model: Model) -> list:
    """``InferRequestedOutput`` for every output of ``model``."""
    return [module.InferRequestedOutput(name) for name in model.output_names]
