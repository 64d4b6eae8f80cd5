"""Input limits, defined once: the Triton models, the CLI and the client all import these.

Every check raises :class:`~facefuse.core.errors.InvalidInput` naming the field and the expectation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from facefuse.core.errors import InvalidInput


@dataclass(frozen=True)
class Limits:
    """Bounds on what a request may carry.

    ``max_image_pixels`` is checked from the image header, before the pixels are decoded, so
    a decompression bomb is refused without allocating its frame.
    """

    max_image_bytes: int = 12 * 1024 * 1024
    max_image_pixels: int = 4096 * 4096
    min_image_side: int = 32
    image_formats: tuple[str, ...] = ("PNG", "JPEG", "WEBP")
    max_instruction_chars: int = 2000
    min_steps: int = 1
    max_steps: int = 100
    min_strength: float = 0.05
    max_strength: float = 1.0
    min_guidance: float = 1.0
    max_guidance: float = 30.0
    max_seed: int = 2**63 - 1
    # raw tensors sent straight to the component models (unet, vae_*, text_encoder)
    max_tensor_side: int = 1024  # pixel side of an image tensor; latents: this // 8
    max_context_tokens: int = 77 * 16  # rows of encoder_hidden_states per sample

    def __post_init__(self) -> None:
        if self.max_image_bytes <= 0 or self.max_image_pixels <= 0:
            raise ValueError("Limits: image limits must be positive")
        if not (0 < self.min_steps <= self.max_steps):
            raise ValueError("Limits: need 0 < min_steps <= max_steps")


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class GenerationParams:
    """Validated sampling parameters of one request."""

    steps: int
    strength: float
    guidance: float
    seed: int


def _finite(field: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise InvalidInput(field, f"must be a finite number, got {value}")
    return value


def check_params(
    steps: int, strength: float, guidance: float, seed: int, limits: Limits = DEFAULT_LIMITS
) -> GenerationParams:
    """Validate sampling parameters; raise InvalidInput naming the first wrong field."""
    if not (limits.min_steps <= int(steps) <= limits.max_steps):
        raise InvalidInput(
            "STEPS", f"must be in {limits.min_steps}..{limits.max_steps}, got {steps}"
        )
    strength = _finite("STRENGTH", strength)
    if not (limits.min_strength <= strength <= limits.max_strength):
        raise InvalidInput(
            "STRENGTH", f"must be in [{limits.min_strength}, {limits.max_strength}], got {strength}"
        )
    guidance = _finite("GUIDANCE", guidance)
    if not (limits.min_guidance <= guidance <= limits.max_guidance):
        raise InvalidInput(
            "GUIDANCE", f"must be in [{limits.min_guidance}, {limits.max_guidance}], got {guidance}"
        )
    if not (0 <= int(seed) <= limits.max_seed):
        raise InvalidInput("SEED", f"must be in 0..{limits.max_seed}, got {seed}")
    return GenerationParams(int(steps), strength, guidance, int(seed))


def check_instruction(
    text: str, field: str = "INSTRUCTION", limits: Limits = DEFAULT_LIMITS
) -> str:
    """Return the stripped instruction; refuse empty, over-long or control-character text."""
    if not isinstance(text, str):
        raise InvalidInput(field, "must be UTF-8 text")
    stripped = text.strip()
    if not stripped:
        raise InvalidInput(field, "must not be empty")
    if len(stripped) > limits.max_instruction_chars:
        raise InvalidInput(
            field, f"must be at most {limits.max_instruction_chars} characters, got {len(stripped)}"
        )
    if any(ord(c) < 32 and c not in "\t\n\r" for c in stripped):
        raise InvalidInput(field, "must not contain control characters")
    return stripped


def check_fusion_instruction(
    text: str | None, field: str = "INSTRUCTION", limits: Limits = DEFAULT_LIMITS
) -> str:
    """A fusion's instruction: like :func:`check_instruction`, but empty (or None) is allowed
    and returned as "": it asks for a plain swap (``facefuse.prompt.plain``)."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return ""
    return check_instruction(text, field=field, limits=limits)


def check_optional_text(
    text: str | None, field: str, limits: Limits = DEFAULT_LIMITS
) -> str | None:
    """Like :func:`check_instruction` for optional text (NEGATIVE_PROMPT): empty is allowed."""
    if text is None or not text.strip():
        return text
    return check_instruction(text, field=field, limits=limits)


def check_tensor(
    field: str,
    shape: tuple[int, ...],
    expected: list,
    *,
    spatial_multiple: int = 1,
    max_side: int | None = None,
    max_sequence: int | None = None,
) -> None:
    """Check a raw tensor's shape against an ONNX input signature before running the graph.

    ``expected`` is the graph's shape (ints fixed, strings or None symbolic, batch first).
    Refuses: another rank, a fixed dimension that differs, any empty dimension, spatial
    sides (the last two of a 4-D tensor) over ``max_side`` or not a multiple of
    ``spatial_multiple``, a sequence (the middle of a 3-D tensor) over ``max_sequence``.
    """
    if len(shape) != len(expected):
        raise InvalidInput(field, f"must have {len(expected)} dimensions, got shape {list(shape)}")
    for axis, (got, want) in enumerate(zip(shape, expected)):
        if isinstance(want, int) and want > 0 and got != want:
            raise InvalidInput(field, f"dimension {axis} must be {want}, got shape {list(shape)}")
        if got < 1:
            raise InvalidInput(field, f"must not have an empty dimension, got shape {list(shape)}")
    if len(shape) == 4:
        for side in shape[2:]:
            if max_side is not None and side > max_side:
                raise InvalidInput(field, f"spatial sides must be at most {max_side}, got {side}")
            if side % spatial_multiple:
                raise InvalidInput(
                    field, f"spatial sides must be multiples of {spatial_multiple}, got {side}"
                )
    if len(shape) == 3 and max_sequence is not None and shape[1] > max_sequence:
        raise InvalidInput(field, f"sequence must be at most {max_sequence} rows, got {shape[1]}")
