"""Instruction (and/or attributes) -> compact prompt, negative prompt and CLIP token ids.

Contract used by the ``prompt_optimizer`` Triton model and by the pipelines:
:func:`optimize` returns an :class:`OptimizedPrompt` whose ``prompt_ids`` and
``negative_ids`` are lists of 77-token chunks of equal count (bos ... eos, padded), ready for
the text encoder.

The steps: validate the text (:func:`facefuse.core.limits.check_instruction`), parse edit clauses
into attributes (:func:`~facefuse.prompt.structured.parse_instruction`), render explicit
attributes first (structured mode), compress the whole (:func:`~facefuse.prompt.compress.compress`),
then account tokens. Past 75 tokens the prompt is either truncated, with a warning that names
the dropped words, or split into 75-token chunks (A1111 style) whose embeddings the text
encoder concatenates; words are never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from facefuse.core.contract import INSTRUCTION
from facefuse.core.errors import InvalidInput
from facefuse.core.limits import check_instruction
from facefuse.prompt.compress import compress, normalize, split_tags
from facefuse.prompt.structured import (
    DEFAULT_FACE_NEGATIVE,
    expression_edit,
    parse_instruction,
    render_attributes,
)
from facefuse.prompt.tokenizer import MAX_LENGTH

DEFAULT_NEGATIVE = DEFAULT_FACE_NEGATIVE
OVERFLOW_MODES = ("truncate", "chunk")
BODY = MAX_LENGTH - 2  # tokens between bos and eos


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
    removed: list[str] = field(default_factory=list)
    canonicalised: list[tuple[str, str]] = field(default_factory=list)
    overflow: str = "truncate"
    template: str = ""

    def info(self) -> dict:
        """JSON-able summary for the INFO output."""
        return {
            "prompt": self.prompt,
            "negative_prompt": self.negative_prompt,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "chunks": len(self.prompt_ids),
            "overflow": self.overflow,
            "template": self.template,
            "attributes": dict(self.attributes),
            "removed": list(self.removed),
            "canonicalised": [list(pair) for pair in self.canonicalised],
            "warnings": list(self.warnings),
            "expression_edit": expression_edit(self.attributes),
        }


def encode_chunks(tokenizer, text: str, mode: str, warnings: list[str]) -> list[list[int]]:
    """Token ids as 77-position chunks: one truncated chunk, or 75-token chunks (A1111 style)."""
    if mode not in OVERFLOW_MODES:
        raise InvalidInput("overflow", f"must be one of {OVERFLOW_MODES}, got {mode!r}")
    body = tokenizer(text, add_special_tokens=False, truncation=False)["input_ids"]
    if len(body) > BODY and mode == "truncate":
        dropped = tokenizer.decode(body[BODY:]).strip()
        warnings.append(
            f"prompt has {len(body)} tokens, truncated to {BODY}; dropped: {dropped!r} "
            "(use overflow='chunk' to keep them)"
        )
        body = body[:BODY]
    elif len(body) > BODY:
        warnings.append(
            f"prompt has {len(body)} tokens, split into {-(-len(body) // BODY)} chunks of "
            f"{BODY} whose embeddings are concatenated"
        )
    pieces = [body[i : i + BODY] for i in range(0, max(len(body), 1), BODY)] or [[]]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    pad = tokenizer.pad_token_id
    return [[bos, *p, eos] + [pad] * (BODY - len(p)) for p in pieces]


# The prompt of an instruction that only removes ("remove the glasses", "别笑" is not one): a
# trained caption that says nothing more (facefuse/train/data.py CAPTIONS "portrait").
EMPTY_EDIT_PROMPT = "portrait"


def _compose(text: str, attributes: dict | None, style: str):
    """Return (prompt, negatives, attributes, compression, warnings) for instruction +
    attributes. Attribute tags are kept apart by commas."""
    parsed = parse_instruction(text) if text else None
    merged: dict = dict(parsed.attributes) if parsed else {}
    parts: list[str] = []
    apart: set[str] = set(parsed.apart) if parsed else set()
    negatives: list[str] = list(parsed.negatives) if parsed else []
    if attributes:
        rendered, extra_neg = render_attributes(attributes, style=style)
        if rendered:
            parts.append(normalize(rendered))
            apart.update(split_tags(parts[-1]))
        negatives += extra_neg
        merged.update(attributes)
    if parsed:
        parts.extend(parsed.clauses)
    source = ", ".join(p for p in parts if p)
    result = compress(source, normalized=True, apart=apart)  # parts are normalised already
    if not result.text and merged:
        result = compress(EMPTY_EDIT_PROMPT)
    warnings = list(parsed.warnings) if parsed else []
    return result.text, negatives, merged, result, warnings


def optimize_text(text: str) -> str:
    """The compact prompt only (what ``prompt-eval`` measures); InvalidInput on bad text."""
    return _compose(check_instruction(text), None, "compact")[0]


def optimize(
    instruction: str,
    tokenizer,
    *,
    overflow: str = "truncate",
    negative_prompt: str | None = None,
    attributes: dict | None = None,
    style: str = "compact",
    template: str = "",
    compress_text: bool = True,
) -> OptimizedPrompt:
    """Compress ``instruction`` (and render ``attributes``) into a prompt with token ids.

    ``instruction`` may be empty when ``attributes`` are given; otherwise InvalidInput is raised
    for empty, over-long or control-character text. ``negative_prompt`` replaces the default
    face negative; items set to False (``glasses=False``, "remove the glasses") are appended to
    it. ``style`` is "compact" or "kv" (every attribute as ``key:value``).

    ``template`` is a fixed deployment prefix put verbatim before the compact prompt (the
    text encoder's prefix cache then reuses its keys/values for every request); it is not
    counted in ``tokens_after``. ``compress_text=False`` sends the instruction as given (what
    a deployment without prompt optimisation does; used by the benchmark baselines).
    """
    if not compress_text:
        return _verbatim(instruction, tokenizer, overflow, negative_prompt)
    if overflow not in OVERFLOW_MODES:
        raise InvalidInput("overflow", f"must be one of {OVERFLOW_MODES}, got {overflow!r}")
    if attributes is not None and not isinstance(attributes, dict):
        raise InvalidInput("ATTRIBUTES", "must be a JSON object of attribute: value")
    if attributes and not (instruction or "").strip():
        text = ""
    else:
        text = check_instruction(instruction)
    prompt, negatives, merged, result, warnings = _compose(text, attributes, style)
    if not prompt:
        raise InvalidInput(INSTRUCTION.name, "has no describable content after optimisation")
    negative = DEFAULT_NEGATIVE if negative_prompt is None else negative_prompt.strip()
    for item in negatives:
        if item not in negative.split(", "):
            negative = f"{negative}, {item}" if negative else item
    sent = with_template(template, prompt)
    prompt_ids = encode_chunks(tokenizer, sent, overflow, warnings)
    negative_ids = encode_chunks(tokenizer, negative, "chunk", [])
    if len(negative_ids) > len(prompt_ids):
        warnings.append(f"negative prompt truncated to {len(prompt_ids)} chunk(s)")
        negative_ids = negative_ids[: len(prompt_ids)]
    while len(negative_ids) < len(prompt_ids):
        negative_ids.append(encode_chunks(tokenizer, "", "truncate", [])[0])
    source = text or prompt
    count = lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"])  # noqa: E731
    return OptimizedPrompt(
        prompt=sent,
        negative_prompt=negative,
        tokens_before=count(source),
        tokens_after=count(prompt),
        template=template.strip(),
        prompt_ids=prompt_ids,
        negative_ids=negative_ids,
        attributes=merged,
        warnings=warnings,
        removed=result.removed,
        canonicalised=result.canonicalised,
        overflow=overflow,
    )


def with_template(template: str, prompt: str) -> str:
    """The text encoded for ``prompt`` under a deployment ``template`` ("" for none); training
    captions are written the same way (:mod:`facefuse.train.loop`)."""
    return f"{template.strip()}, {prompt}" if template.strip() else prompt


def _verbatim(instruction: str, tokenizer, overflow: str, negative_prompt: str | None):
    """The instruction as given, with the default negative prompt: no optimisation at all."""
    text = check_instruction(instruction)
    negative = DEFAULT_NEGATIVE if negative_prompt is None else negative_prompt.strip()
    warnings: list[str] = []
    prompt_ids = encode_chunks(tokenizer, text, overflow, warnings)
    negative_ids = encode_chunks(tokenizer, negative, "truncate", [])
    while len(negative_ids) < len(prompt_ids):
        negative_ids.append(encode_chunks(tokenizer, "", "truncate", [])[0])
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return OptimizedPrompt(
        prompt=text,
        negative_prompt=negative,
        tokens_before=tokens,
        tokens_after=tokens,
        prompt_ids=prompt_ids,
        negative_ids=negative_ids,
        warnings=warnings,
        overflow=overflow,
    )
