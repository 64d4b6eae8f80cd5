"""Whose expression the fused face wears, and the edits on top of it.

An :class:`ExpressionEdit` travels from the ``facefusion`` pipeline to ``face_analyzer`` as
JSON (the ``EXPRESSION`` input). :meth:`ExpressionEdit.wanted` turns it into the expression
coefficients (:data:`facefuse.face.expression.MODES`) that A's face is moved to. Only the
smile and mouth_open modes move, by their *expression part* (:func:`expression_part`: beyond the
band within which the training people's neutral photos read, so face shape is not mistaken for
expression), on top of A's own face with its own expression part taken out:

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
    check_face_select,
)
from facefuse.face.expression import MODES

SOURCES = EXPRESSION_SOURCES
SMILE_RANGE = EXPRESSION_SMILE.range
MOUTH_OPEN_RANGE = EXPRESSION_MOUTH_OPEN.range
SMILE, MOUTH_OPEN = MODES.index("smile"), MODES.index("mouth_open")
# What the face stage multiplies every increase of a mode by: a piecewise-affine warp of A's
# closed-mouth photo shows less of a smile (dlib's mouth width and corner rise on held-out
# London people) than its points move. Words and numbers: WARP_GAIN ("make them smile",
# paste-only: 47% of the person's own smile at 1 on 8 pairs, 112% at 2 on 16); B's own expression
# carried over: TRANSFER_GAIN (B's smile: 158% at 2, 126% at 1.5, d(A) 0.56 -> 0.54).
WARP_GAIN = 2.0
TRANSFER_GAIN = 1.5

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
    gain: float = WARP_GAIN  # multiplies every increase of a mode
    gain_down: float = 1.0  # multiplies every decrease of a mode
    transfer_gain: float = TRANSFER_GAIN  # multiplies an increase carried over from B (or A)
    face_select: str = "largest"  # which faces of B: largest, all, reference (face.select)
    face_index: int = 0  # which of the chosen faces this call fuses
    # a stream's mouth and eyes follow B's frame by frame (facefuse.face.lips): A's lower lip
    # is set to B's lip parting and A's eyelids to B's eye opening, in eye spans; the
    # mouth_open mode then stays A's own
    follow_target: bool = False
    # B's eye opening over its open eye (per eye, image left then right; a stream's ratio to
    # its running maximum), applied to A's eyes when follow_target
    target_eye_ratio: tuple[float, float] | None = None
    # B's inner-lip parting in eye spans (a stream's, from the raw points); None: the mesh's
    target_lip_gap: float | None = None

    def __post_init__(self) -> None:
        check_expression(self.source, self.smile, self.mouth_open)
        check_face_select(self.face_select, True)
        if self.face_index < 0:
            raise ValueError(f"face_index must be >= 0, got {self.face_index}")

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
            gain=float(data.get("gain", WARP_GAIN)),
            transfer_gain=float(data.get("transfer_gain", TRANSFER_GAIN)),
            gain_down=float(data.get("gain_down", 1.0)),
            face_select=str(data.get("face_select", "largest")),
            face_index=int(data.get("face_index", 0)),
            follow_target=bool(data.get("follow_target", False)),
            target_eye_ratio=None
            if data.get("target_eye_ratio") is None
            else tuple(float(v) for v in data["target_eye_ratio"]),
            target_lip_gap=None
            if data.get("target_lip_gap") is None
            else float(data["target_lip_gap"]),
        )

    def wanted(
        self, source: np.ndarray, target: np.ndarray, band: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict]:
        """(the coefficients A's face is moved to, what was applied) from A's (``source``) and
        B's (``target``) own coefficients. Only :data:`TRANSFERRED` modes move, and only by
        their expression part (:func:`expression_part`, outside ``band``): what lies within
        the band of neutral faces is face shape and stays A's."""
        own = np.asarray(source, np.float64)
        band = np.zeros_like(own) if band is None else np.asarray(band, np.float64)
        own_part = expression_part(own, band)
        theirs = expression_part(target, band)
        if self.follow_target:  # the lips are set to B's parting after the warp, not by the
            # mode (on a talking B the mode also thickened A's lower lip: issue 40)
            theirs[MOUTH_OPEN] = own_part[MOUTH_OPEN]
        chosen = own_part if self.source == "source" else theirs
        part = chosen.copy()
        words = self.words
        if words.get("reset"):
            part[:] = 0.0
        if words.get("smile", 0.0) > 0:
            part[SMILE] = max(part[SMILE], float(words["smile"]))
        if words.get("mouth_open", 0.0) > 0:
            part[MOUTH_OPEN] = max(part[MOUTH_OPEN], float(words["mouth_open"]))
        if self.smile is not None:
            part[SMILE] = chosen[SMILE] + self.smile
        if self.mouth_open is not None:
            part[MOUTH_OPEN] = chosen[MOUTH_OPEN] + self.mouth_open
        change = part - own_part
        # a warp shows less smile than its points move: increases are multiplied, by ``gain``
        # where words or numbers set the mode, by ``transfer_gain`` where it is the chosen
        # face's own expression
        edited = part != chosen
        up = np.where(edited, self.gain, self.transfer_gain)
        change = np.where(change > 0, change * up, change * self.gain_down)
        wanted = own + change
        applied = {
            "source": self.source,
            "smile": round(float(part[SMILE] - chosen[SMILE]), 3),
            "mouth_open": round(float(part[MOUTH_OPEN] - chosen[MOUTH_OPEN]), 3),
            "reset": bool(words.get("reset")) and self.smile is None,
            "from": {
                "smile": "request" if self.smile is not None else "instruction",
                "mouth_open": "request" if self.mouth_open is not None else "instruction",
            },
            "expression": {
                "source": _named(own_part),
                "target": _named(theirs),
                "applied": _named(part),
            },
        }
        return wanted, applied


TRANSFERRED = (SMILE, MOUTH_OPEN)


def expression_part(coefficients: np.ndarray, band: np.ndarray) -> np.ndarray:
    """The expression in a face's coefficients: the :data:`TRANSFERRED` modes beyond ``band``
    (a neutral face's spread; soft-thresholded), 0 for the other modes; ``mouth_open`` is
    never below 0."""
    c = np.asarray(coefficients, np.float64)
    part = np.zeros_like(c)
    for i in TRANSFERRED:
        part[i] = np.sign(c[i]) * max(abs(c[i]) - float(band[i]), 0.0)
    # lips pressed tighter than the neutral faces' are A's face, not an expression to undo:
    # carrying B's closed mouth over to them would part A's lips (and show teeth) on a face
    # that asked for no change
    part[MOUTH_OPEN] = max(part[MOUTH_OPEN], 0.0)
    return part


def _named(values: np.ndarray) -> dict[str, float]:
    return {MODES[i]: round(float(values[i]), 3) for i in TRANSFERRED}


def check_expression(source: str, smile: float | None, mouth_open: float | None) -> None:
    """:class:`~facefuse.core.errors.InvalidInput` naming the first bad request field."""
    check_expression_inputs(source, smile, mouth_open)
