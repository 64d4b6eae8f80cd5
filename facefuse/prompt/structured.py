"""Structured mode: attributes -> compact ``key:value`` prompt, and instruction -> attributes.

:func:`render_attributes` writes every attribute the user gave, identity first. A value that
names itself (``"smiling"``, ``True`` for ``glasses``) is written bare, a value whose key is a
noun it qualifies is written before that noun (``lighting="soft studio"`` -> ``soft studio
lighting``), anything else as ``key:value`` (``age:35``). ``False`` moves the item to the
negative prompt (``glasses=False`` -> negative ``glasses``). No attribute is ever dropped:
:func:`render_attributes` checks that each value's words are in the result.

:func:`parse_instruction` maps the edit language of a ``facefusion`` INSTRUCTION ("make her
smile, keep the glasses, studio light") to attributes; clauses it does not understand are
kept verbatim for the compressor, never discarded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from facefuse.core.errors import InvalidInput
from facefuse.prompt.compress import normalize, split_tags

DEFAULT_FACE_NEGATIVE = "blurry, deformed eyes, asymmetrical face, lowres, bad anatomy"

# Rendering order after identity; unknown keys follow in the order given.
ORDER = (
    "identity",
    "age",
    "gender",
    "ethnicity",
    "expression",
    "pose",
    "gaze",
    "hair",
    "eyes",
    "skin",
    "makeup",
    "beard",
    "glasses",
    "accessories",
    "clothing",
    "lighting",
    "background",
    "camera",
    "style",
    "quality",
)
# key -> noun written after the value ("soft studio" + " lighting").
NOUN_KEYS = {
    "lighting": "lighting",
    "hair": "hair",
    "eyes": "eyes",
    "background": "background",
    "skin": "skin",
    "makeup": "makeup",
    "beard": "beard",
    "clothing": "",
    "style": "style",
    "expression": "",
    "pose": "",
    "identity": "",
    "accessories": "",
    "gaze": "",
    "quality": "",
    "ethnicity": "",
    "gender": "",
    "age": "",
}
_NOUN_SYNONYMS = {"lighting": ("light", "lighting", "lit", "lights")}

# Items that are present or absent (True/False attributes).
ITEMS = (
    "glasses",
    "sunglasses",
    "eyeglasses",
    "spectacles",
    "beard",
    "mustache",
    "moustache",
    "hat",
    "cap",
    "earrings",
    "earring",
    "necklace",
    "makeup",
    "lipstick",
    "freckles",
    "tattoo",
    "tattoos",
    "scarf",
    "headphones",
    "mask",
    "piercing",
    "veil",
    "crown",
    "tie",
    "bangs",
    "smile",
    "wrinkles",
    "scar",
    "helmet",
    "hood",
    "headband",
    "bow tie",
    "goatee",
)
_EXPRESSION_VERBS = {
    "smile": "smiling",
    "smiling": "smiling",
    "laugh": "laughing",
    "laughing": "laughing",
    "frown": "frowning",
    "frowning": "frowning",
    "grin": "grinning",
    "grinning": "grinning",
    "cry": "crying",
    "crying": "crying",
    "wink": "winking",
    "winking": "winking",
    "pout": "pouting",
    "scowl": "scowling",
}
_MOODS = (
    "happy",
    "sad",
    "angry",
    "surprised",
    "serious",
    "calm",
    "confident",
    "scared",
    "shocked",
    "neutral",
    "thoughtful",
    "pensive",
    "excited",
    "friendly",
    "stern",
    "relaxed",
    "joyful",
    "melancholic",
    "smug",
    "tired",
    "disgusted",
    "determined",
    "playful",
    "mysterious",
)
_ITEM_RE = "|".join(sorted((re.escape(i) for i in ITEMS), key=len, reverse=True))
_WHO = r"(?:him|her|them|the (?:person|man|woman|girl|boy|subject|face)|it|me|us)"

# What may precede a qualified noun ("keep her short hair", "with red hair", "under soft
# light", "in front of a brick background"); the qualifier itself may be absent ("keep the hair").
_LEAD = (
    rf"(?:please )?(?:(?:keep|add|use|with|wearing|give {_WHO}|make {_WHO}|put|place|in front of|"
    rf"in|under|on|against|has|have) )?(?:(?:a|an|the|some|his|her|their|its) )?"
)
# noun in an edit ("change the light to warm") -> attribute key
_NOUNS = {
    "hair": "hair",
    "eyes": "eyes",
    "background": "background",
    "lighting": "lighting",
    "light": "lighting",
}
_NOUN_RE = "|".join(_NOUNS)

_RULES: tuple[tuple[re.Pattern, str], ...] = tuple(
    (re.compile(p), kind)
    for p, kind in (
        (
            rf"^(?:please )?(?:make|let) {_WHO} (?:look )?(?P<v>{'|'.join(_EXPRESSION_VERBS)})$",
            "expression_verb",
        ),
        (
            rf"^(?:please )?(?:make {_WHO} (?:look )?|{_WHO} (?:should )?(?:look )?)"
            rf"(?:more |a bit |slightly )?(?P<v>{'|'.join(_MOODS)})$",
            "mood",
        ),
        (rf"^(?:please )?(?:make {_WHO} (?:look )?)(?P<v>older|younger)$", "age_rel"),
        (
            rf"^(?:please )?(?:keep|add|give {_WHO}|put on|with|wearing|wear|show) (?:the |a |an |"
            rf"some |his |her |their )?(?P<v>(?:[a-z]+ )?(?:{_ITEM_RE}))$",
            "item_on",
        ),
        (
            r"^(?:please )?(?:remove|delete|take off|without|no|drop|lose|get rid of) "
            rf"(?:the |a |an |his |her |their |any )?(?P<v>(?:[a-z]+ )?(?:{_ITEM_RE}))$",
            "item_off",
        ),
        (
            r"^(?:please )?(?:change|set|turn|make|keep|dye|colou?r) "
            rf"(?:the |his |her |their |its )?(?P<k>{_NOUN_RE}) "
            r"(?:to |into |as )?(?P<v>[a-z][a-z -]*)$",
            "noun_change",
        ),
        (rf"^{_LEAD}(?P<v>[a-z][a-z -]*?) (?:light|lighting|lights|lit)$", "lighting"),
        # a bare noun ("keep the hair") is the attribute set to True
        (rf"^{_LEAD}(?:(?P<v>[a-z][a-z -]*?) )?hair$", "hair"),
        (rf"^{_LEAD}(?:(?P<v>[a-z][a-z -]*?) )?eyes$", "eyes"),
        (rf"^{_LEAD}(?:(?P<v>[a-z][a-z -]*?) )?background$", "background"),
        (
            r"^(?:(?:make it |render it |do it )?(?:in |as )?(?:the )?(?:style of |in )?)"
            r"(?P<v>[a-z -]+?) style$",
            "style",
        ),
        (
            r"^(?:make it |render it |do it )?(?:in |with )?(?:the )?style of (?P<v>[a-z -]+)$",
            "style",
        ),
        (
            r"^(?:(?:make {_WHO} |aged? |about |around )?)(?P<v>\d{1,3})(?: ?(?:years? old|yo|"
            r"years|yrs?))?$".replace("{_WHO}", _WHO),
            "age",
        ),
    )
)


# A clause that starts with one of these is an edit request and is rewritten from its
# attribute ("make her smile" -> "smiling"); any other recognised clause is kept verbatim.
EDIT_VERBS = frozenset(
    "make keep add give put remove delete take drop lose get change set turn let use please".split()
)
_CLAUSE_AND = re.compile(
    r"\b(?:and then|then|also|and (?=(?:please )?(?:make|keep|add|remove|give|put|change|turn|"
    r"use|set|let|take|delete|drop|get rid)\b))",
    re.IGNORECASE,
)


def _words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())


@dataclass
class ParsedInstruction:
    """Attributes found in an instruction, and the prompt clauses in their original order.

    Clauses are normalised (:func:`~facefuse.prompt.compress.normalize`), ready for
    ``compress(..., normalized=True)``.

    ``clauses`` holds each recognised clause rendered from its attribute ("make her smile" ->
    "smiling") and each unrecognised clause verbatim; ``negatives`` the removed items.
    """

    attributes: dict = field(default_factory=dict)
    clauses: list[str] = field(default_factory=list)
    negatives: list[str] = field(default_factory=list)


_FIRST_WORDS = frozenset(
    "please make let keep add give put wear wearing with show remove delete take without no "
    "drop lose get change set turn use in under on against place a an the some him her them it "
    "me us render do as aged age about around dye color colour".split()
)
_LAST_WORDS = frozenset("light lighting lights lit hair eyes background style".split())


def _match_clause(clause: str) -> tuple[str, object] | None:
    words = clause.split()
    if not words or not (
        words[0] in _FIRST_WORDS
        or words[-1] in _LAST_WORDS
        or words[0][:1].isdigit()
        or "style of" in clause
    ):
        return None  # no rule can match: skip the regexes
    for pattern, kind in _RULES:
        match = pattern.match(clause)
        if match is None:
            continue
        if match["v"] is None:
            return kind, True
        value = match["v"].strip()
        if " with " in f" {value} ":
            return None  # "a woman with red hair": the value would swallow the subject
        if kind == "noun_change":
            return _NOUNS[match["k"]], value
        if kind == "expression_verb":
            return "expression", _EXPRESSION_VERBS[value]
        if kind == "mood":
            return "expression", value
        if kind == "age_rel":
            return "age", value
        if kind in ("item_on", "item_off"):
            noun = "bow tie" if value.endswith("bow tie") else value.split()[-1]
            qualifier = value[: -len(noun)].strip()
            if kind == "item_off":
                return noun, False
            return noun, qualifier or True
        if kind == "age":
            return "age", int(value)
        return kind, value
    return None


def parse_instruction(text: str) -> ParsedInstruction:
    """Map an edit instruction to attributes; unparsed clauses are kept verbatim, in order."""
    parsed = ParsedInstruction()
    for clause in split_tags(normalize(_CLAUSE_AND.sub(",", text))):
        found = _match_clause(clause)
        if found is None:
            parsed.clauses.append(clause)
            continue
        key, value = found
        if key in parsed.attributes and parsed.attributes[key] != value:
            old = parsed.attributes[key]
            parsed.attributes[key] = f"{old}, {value}" if value is not False else old
        else:
            parsed.attributes[key] = value
        if value is False:
            parsed.negatives.append(key)
        if clause.split(" ", 1)[0] not in EDIT_VERBS:
            parsed.clauses.append(clause)  # descriptive already ("no glasses", "ring light")
        elif value is not False:
            parsed.clauses.append(_render_one(key, value))
    return parsed


def _render_one(key: str, value) -> str:
    noun = NOUN_KEYS.get(key)
    if value is True:
        return key
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{key}:{value:g}" if isinstance(value, float) else f"{key}:{value}"
    text = re.sub(r"\s+", " ", str(value)).strip()
    if key in ITEMS:  # qualified item: "round" glasses
        return text if key in _words(text) else f"{text} {key}"
    if noun is None:
        return f"{key}:{text}"
    if not noun:
        return text
    if any(w in _words(text) for w in _NOUN_SYNONYMS.get(noun, (noun,))):
        return text
    return f"{text} {noun}"


def render_attributes(attributes: dict, *, style: str = "compact") -> tuple[str, list[str]]:
    """Return ``(prompt, negatives)``: every attribute rendered, identity first.

    ``style="compact"`` writes self-describing values bare and qualifiers before their noun;
    ``style="kv"`` writes every attribute as ``key:value``. Raises InvalidInput for values that
    are neither text, numbers nor booleans.
    """
    if style not in ("compact", "kv"):
        raise InvalidInput("style", f"must be 'compact' or 'kv', got {style!r}")
    keys = [k for k in ORDER if k in attributes] + [k for k in attributes if k not in ORDER]
    parts: list[str] = []
    negatives: list[str] = []
    for key in keys:
        value = attributes[key]
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z][\w -]{0,40}", key):
            raise InvalidInput("ATTRIBUTES", f"keys must be short words, got {key!r}")
        if value is None or value == "":
            continue
        if not isinstance(value, (str, int, float, bool)):
            raise InvalidInput(
                "ATTRIBUTES", f"{key} must be text, a number or true/false, got {type(value)}"
            )
        if value is False:
            negatives.append(key)
            continue
        if style == "kv" and value is not True:
            parts.append(f"{key}:{value}")
        else:
            parts.append(_render_one(key, value))
    prompt = ", ".join(parts)
    missing = [
        k
        for k in keys
        if attributes[k] not in (False, None, "")
        and not set(_words(str(attributes[k]) if attributes[k] is not True else k))
        <= set(_words(prompt))
    ]
    if missing:  # cannot happen with the rules above; guards future edits
        raise RuntimeError(f"attributes lost while rendering: {missing}")
    return prompt, negatives
