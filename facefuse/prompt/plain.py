"""A plain fusion: the request asks for nothing beyond the swap itself.

An empty instruction, "swap the face", "keep the expression", "换脸", "保持表情" and the like
ask for FaceFusion's plain swap: A's identity in B's pose and expression, no edit. The fusion
pipelines serve them with :data:`PLAIN_PROMPT` (a caption every training photo could carry) and
say so in INFO (``"asked": "nothing"``); so does an instruction in which the prompt optimiser
finds nothing to describe. txt2img has no such case: its prompt must say what to draw.
"""

from __future__ import annotations

import re
import unicodedata

PLAIN_PROMPT = "portrait photo"

_EN = re.compile(
    r"^(?:please\s+)?(?:"
    r"(?:just\s+)?(?:swap|switch|change|replace)(?:\s+(?:the|my|his|her|their|a))?"
    r"(?:\s+faces?)?(?:\s+only)?"
    r"|(?:a\s+)?(?:plain\s+)?face\s*swap"
    r"|(?:keep|same|leave)(?:\s+(?:the|his|her|their|its))?(?:\s+(?:original|own|same))?"
    r"\s+(?:expressions?|face|pose|look)(?:\s+(?:as\s+it\s+is|unchanged|the\s+same))?"
    r"|(?:no|without)\s+(?:changes?|edits?)|nothing(?:\s+else)?|as\s+(?:it\s+)?is|none"
    r")[\s.!。]*$"
)
_ZH = re.compile(
    r"^(?:请)?(?:帮我)?(?:"
    r"换(?:个|一下|一张)?脸|换脸吧|人脸替换|替换人脸|脸部替换"
    r"|保持(?:原来的|原有的|原)?表情(?:不变)?|表情不变|保持原样|不用改|不要改动|无|没有"
    r")[\s.!。！]*$"
)


def is_plain(instruction: str | None) -> bool:
    """True when ``instruction`` asks for a plain swap (see the module docstring)."""
    if instruction is None:
        return True
    text = unicodedata.normalize("NFKC", instruction).strip().lower()
    if not text:
        return True
    return bool(_EN.match(text) or _ZH.match(text.replace(" ", "")))
