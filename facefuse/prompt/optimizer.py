"""Instruction -> compact prompt, negative prompt and CLIP token ids (first, simple version).

Contract used by the ``prompt_optimizer`` Triton model and by the pipelines:
:func:`optimize` returns an :class:`OptimizedPrompt` whose ``prompt_ids`` and
``negative_ids`` are lists of 77-token chunks of equal count (bos ... eos, padded), ready for
the text encoder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from facefuse.limits import check_instruction
from facefuse.prompt.tokenizer import MAX_LENGTH

DEFAULT_NEGATIVE = "blurry, deformed eyes, asymmetrical face, lowres, bad anatomy"
OVERFLOW_MODES = ("truncate", "chunk")

_FILLER = re.compile(r"\b(please|make|him|her|them|the|a|an|keep)\b", re.IGNORECASE)


@dataclass
class OptimizedPrompt:
    """A compact prompt and its CLIP accounting. Chunk lists have equal length >= 1."""

    prompt: str
    negative_prompt: str
    tokens_before: int
    tokens_after: int
    prompt_ids: list[list[int]]
    negative_ids: list[list[int]]
    attributes: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def info(self) -> dict:
        return {
            "prompt": self.prompt,
            "negative_prompt": self.negative_prompt,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "chunks": len(self.prompt_ids),
            "warnings": list(self.warnings),
        }


def compress(text: str) -> str:
    """Drop filler words and repeated comma-separated tags, keeping order."""
    parts = [re.sub(r"\s+", " ", _FILLER.sub(" ", p)).strip() for p in text.split(",")]
    seen: set[str] = set()
    kept = []
    for part in parts:
        if part and part.lower() not in seen:
            seen.add(part.lower())
            kept.append(part)
    return ", ".join(kept)


def encode_chunks(tokenizer, text: str, mode: str, warnings: list[str]) -> list[list[int]]:
    """Token ids as 77-position chunks: one truncated chunk, or 75-token chunks (A1111 style)."""
    if mode not in OVERFLOW_MODES:
        raise ValueError(f"overflow mode must be one of {OVERFLOW_MODES}, got {mode!r}")
    body = tokenizer(text, add_special_tokens=False, truncation=False)["input_ids"]
    width = MAX_LENGTH - 2
    if len(body) > width and mode == "truncate":
        dropped = tokenizer.decode(body[width:])
        warnings.append(f"prompt truncated to {width} tokens; dropped: {dropped!r}")
        body = body[:width]
    pieces = [body[i : i + width] for i in range(0, max(len(body), 1), width)] or [[]]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    return [[bos, *p, eos] + [pad] * (width - len(p)) for p in pieces]


def optimize(
    instruction: str,
    tokenizer,
    *,
    overflow: str = "truncate",
    negative_prompt: str | None = None,
) -> OptimizedPrompt:
    """Compress ``instruction`` into a prompt with token ids; raises InvalidInput if empty."""
    text = check_instruction(instruction)
    prompt = compress(text) or text
    negative = DEFAULT_NEGATIVE if negative_prompt is None else negative_prompt
    warnings: list[str] = []
    prompt_ids = encode_chunks(tokenizer, prompt, overflow, warnings)
    negative_ids = encode_chunks(tokenizer, negative, "truncate", [])
    while len(negative_ids) < len(prompt_ids):
        negative_ids.append(encode_chunks(tokenizer, "", "truncate", [])[0])
    count = lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    return OptimizedPrompt(
        prompt=prompt,
        negative_prompt=negative,
        tokens_before=count(text),
        tokens_after=count(prompt),
        prompt_ids=prompt_ids,
        negative_ids=negative_ids,
        warnings=warnings,
    )
