"""Input limits, defined once: the Triton models, the CLI and the client all import these.

Every check raises :class:`~facefuse.errors.InvalidInput` naming the field and the expectation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from facefuse.errors import InvalidInput


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
