"""Whose expression the fused face wears, and the edits on top of it.

An :class:`ExpressionEdit` travels from the ``facefusion`` pipeline to ``face_analyzer`` as
JSON (the ``EXPRESSION`` input). :meth:`ExpressionEdit.wanted` turns it into the expression
coefficients (:data:`facefuse.face.expression.MODES`) that A's face is moved to:

1. the base: B's coefficients (``source`` "target", the default: identity from A, expression
   from B) or A's own (``source`` "source");
2. the instruction's words (:func:`words_from_instruction`): "neutral" / "don't smile" sets
   every mode to 0 (``reset``); a smile word raises the smile to at least its level (slight
   0.5, normal 1.0, big 1.5; 1.0 is the London set's average smile), "open mouth" the lip
   parting to at least 1.0 (0.25 eye spans);
3. the request's numbers, which override the words for their mode: ``smile`` in
   :data:`SMILE_RANGE` and ``mouth_open`` in :data:`MOUTH_OPEN_RANGE` are added to the base's
   value (FaceFusion's face-editor sliders: 0 leaves the chosen expression as it is).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

import numpy as np

from facefuse.core.contract import (
    EXPRESSION_MOUTH_OPEN,
    EXPRESSION_SMILE,
    EXPRESSION_SOURCES,
    check_expression_inputs,
)
from facefuse.face.expression import MODES

SOURCES = EXPRESSION_SOURCES
SMILE_RANGE = EXPRESSION_SMILE.range
MOUTH_OPEN_RANGE = EXPRESSION_MOUTH_OPEN.range
SMILE, MOUTH_OPEN = MODES.index("smile"), MODES.index("mouth_open")

_NO_SMILE = re.compile(
    r"\bneutral\b|\bstraight face\b|\bserious\b|"
    r"\b(?:don'?t|do not|no|not|stop|without(?: a)?)\s+(?:\w+\s+)?(?:smil|grin)\w*"
)
_SMILE = re.compile(r"\b(?:smil|grin|laugh)\w*")
_SLIGHT = re.compile(r"\b(?:slight(?:ly)?|little|subtle|faint|soft|small|gentle|hint)\b")
_BIG = re.compile(r"\b(?:big|broad(?:ly)?|wide(?:ly)?|huge|grin\w*|laugh\w*|beam\w*)\b")
_OPEN = re.compile(r"\bopen(?:ed|ing)?\s+(?:\w+\s+)?mouth\b|\bmouth\s+(?:wide\s+)?open\b")


def words_from_instruction(instruction: str) -> dict:
    """``{"reset": bool, "smile": float, "mouth_open": float}`` from the instruction's words.

    Uses ``facefuse.prompt.structured.expression_edit`` (the instruction parser's own reading)
    when that exists, else the small word list here."""
    try:
        from facefuse.prompt.structured import expression_edit, parse_instruction
    except ImportError:  # the instruction parser's reading is not installed: the word list
        return _local_words(instruction)
    edit = expression_edit(parse_instruction(instruction).attributes)
    return {
        "reset": bool(edit.get("reset", False)),
        "smile": float(edit.get("smile", 0.0)),
        "mouth_open": float(edit.get("mouth_open", 0.0)),
    }


def _local_words(instruction: str) -> dict:
    text = instruction.lower().replace("\u2019", "'")
    reset = bool(_NO_SMILE.search(text))
    smile = 0.0
    if not reset and _SMILE.search(text):
        smile = 0.5 if _SLIGHT.search(text) else 1.5 if _BIG.search(text) else 1.0
    return {"reset": reset, "smile": smile, "mouth_open": 1.0 if _OPEN.search(text) else 0.0}


@dataclass(frozen=True)
class ExpressionEdit:
    """See the module docstring. ``smile`` / ``mouth_open``: the request's numbers (None when
    not sent); ``words``: :func:`words_from_instruction`'s answer."""

    source: str = "target"
    smile: float | None = None
    mouth_open: float | None = None
    words: dict = field(default_factory=lambda: {"reset": False, "smile": 0.0, "mouth_open": 0.0})

    def __post_init__(self) -> None:
        check_expression(self.source, self.smile, self.mouth_open)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ExpressionEdit:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("expression edit JSON must be an object")
        return cls(
            source=str(data.get("source", "target")),
            smile=None if data.get("smile") is None else float(data["smile"]),
            mouth_open=None if data.get("mouth_open") is None else float(data["mouth_open"]),
            words=dict(data.get("words") or cls().words),
        )

    def wanted(self, source: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, dict]:
        """(the coefficients A's face is moved to, what was applied) from A's (``source``) and
        B's (``target``) own coefficients."""
        base = np.array(target if self.source == "target" else source, np.float64)
        wanted = base.copy()
        words = self.words
        if words.get("reset"):
            wanted[:] = 0.0
        if words.get("smile", 0.0) > 0:
            wanted[SMILE] = max(wanted[SMILE], float(words["smile"]))
        if words.get("mouth_open", 0.0) > 0:
            wanted[MOUTH_OPEN] = max(wanted[MOUTH_OPEN], float(words["mouth_open"]))
        if self.smile is not None:
            wanted[SMILE] = base[SMILE] + self.smile
        if self.mouth_open is not None:
            wanted[MOUTH_OPEN] = base[MOUTH_OPEN] + self.mouth_open
        applied = {
            "source": self.source,
            "smile": round(float(wanted[SMILE] - base[SMILE]), 3),
            "mouth_open": round(float(wanted[MOUTH_OPEN] - base[MOUTH_OPEN]), 3),
            "reset": bool(words.get("reset")) and self.smile is None,
            "from": {
                "smile": "request" if self.smile is not None else "instruction",
                "mouth_open": "request" if self.mouth_open is not None else "instruction",
            },
        }
        return wanted, applied


def check_expression(source: str, smile: float | None, mouth_open: float | None) -> None:
    """:class:`~facefuse.core.errors.InvalidInput` naming the first bad request field."""
    check_expression_inputs(source, smile, mouth_open)
