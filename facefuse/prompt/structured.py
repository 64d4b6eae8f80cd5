"""Structured mode: attributes -> compact ``key:value`` prompt, and instruction -> attributes.

:func:`render_attributes` writes every attribute the user gave, identity first. A value that
names itself (``"smiling"``, ``True`` for ``glasses``) is written bare, a value whose key is a
noun it qualifies is written before that noun (``lighting="soft studio"`` -> ``soft studio
lighting``), anything else as ``key:value`` (``age:35``). ``False`` moves the item to the
negative prompt (``glasses=False`` -> negative ``glasses``). No attribute is ever dropped:
:func:`render_attributes` checks that each value's words are in the result.

:func:`parse_instruction` maps the edit language of a ``facefusion`` INSTRUCTION, English or
Chinese ("make her smile, keep the glasses, studio light", "让他微笑，保留眼镜") to attributes
(:mod:`facefuse.prompt.understand` reads each clause); clauses it does not understand are kept
verbatim for the compressor, never discarded. A later clause overrides an earlier one ("smile,
don't smile" -> neutral expression) and a warning says so.

Canonical face-edit values (the words the text tower was trained on, and what
:func:`expression_edit` turns into the face warp's parameters):

* ``expression``: "slight smile", "smiling", "big smile", "neutral expression" or "open mouth";
  a negated smile ("don't smile", "stop smiling", "别笑") is "neutral expression";
* ``mouth``: "open" or "closed", only next to a smile or a neutral expression ("smile with an
  open mouth" -> ``expression: "smiling", mouth: "open"``); an open mouth alone is
  ``expression: "open mouth"``;
* ``eyes``: "closed" or "open" (or a colour: "keep his blue eyes" -> "blue");
* items (glasses, beard, hat ...) and ``hair``: True to keep or add, False to remove (the item
  goes to the negative prompt), or a qualifier ("round" glasses);
* ``lighting`` ("soft studio", "natural" ...), ``style`` ("black and white"), ``background``,
  ``age`` ("older", "younger" or years); ``mood`` for other moods ("surprised").

In the prompt, slight smile and smiling are written "smiling" (the trained caption), big smile
"big smile", lighting "<value> light", black and white "black and white photo"; each attribute
is its own comma-separated tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from facefuse.core.errors import InvalidInput
from facefuse.prompt import lexicon as lx
from facefuse.prompt.compress import _BINOMIAL_RE, normalize, split_tags
from facefuse.prompt.understand import (
    ClauseReading,
    Event,
    has_chinese,
    read_clause,
    resolve,
    to_simplified,
    unknown_language,
)

DEFAULT_FACE_NEGATIVE = "blurry, deformed eyes, asymmetrical face, lowres, bad anatomy"

# Rendering order after identity; unknown keys follow in the order given.
ORDER = (
    "identity",
    "age",
    "gender",
    "ethnicity",
    "expression",
    "mouth",
    "mood",
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
    "lighting": "light",
    "hair": "hair",
    "eyes": "eyes",
    "background": "background",
    "skin": "skin",
    "makeup": "makeup",
    "beard": "beard",
    "clothing": "",
    "style": "style",
    "expression": "",
    "mood": "",
    "mouth": "mouth",
    "pose": "",
    "identity": "",
    "accessories": "",
    "gaze": "",
    "quality": "",
    "ethnicity": "",
    "gender": "",
    "age": "",
}
_LIGHT_NOUNS = ("daylight", "sunlight", "moonlight", "candlelight", "sunshine")
_NOUN_SYNONYMS = {"light": ("light", "lighting", "lit", "lights", *_LIGHT_NOUNS)}
# Canonical values written in the trained captions' words (facefuse/train/data.py CAPTIONS).
CANONICAL_TEXT = {
    ("expression", lx.SLIGHT_SMILE): "smiling",
    ("expression", lx.SMILING): "smiling",
    ("expression", lx.BIG_SMILE): "big smile",
    ("expression", lx.NEUTRAL): "neutral expression",
    ("expression", lx.OPEN_MOUTH): "open mouth",
    ("mouth", "open"): "open mouth",
    ("mouth", "closed"): "closed mouth",
    ("eyes", "open"): "open eyes",
    ("eyes", "closed"): "closed eyes",
    ("style", lx.BLACK_AND_WHITE): "black and white photo",
}

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
ITEM_KEYS = frozenset(ITEMS) | frozenset(lx.EN_ITEMS.values()) | frozenset(lx.ZH_ITEMS.values())
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
        (rf"^{_LEAD}(?P<v>(?:[a-z][a-z -]*? )?(?:{'|'.join(_LIGHT_NOUNS)}))$", "lighting"),
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
    r"\b(?:and then|then|also|or (?:maybe|rather|perhaps|actually|even|just)|"
    r"(?:and|but) (?=(?:please )?(?:make|keep|add|remove|give|put|change|"
    r"turn|use|set|let|take|delete|drop|get rid|close|open|shut|stop|don't|dont|do not|no|"
    r"smile|laugh|grin|look|wear|without)\b))",
    re.IGNORECASE,
)
_ZH_JOIN = re.compile("|".join(lx.ZH_CLAUSE_JOINERS))
# rule kinds whose whole-clause match is taken before the lexicon reads the clause
_NOUN_KINDS = frozenset(
    {"noun_change", "lighting", "hair", "background", "style", "age", "age_rel"}
)
_POLITE_END = re.compile(r"(?: please| pls| plz| thanks| thank you)+$")
_EYE_STATE_WORDS = frozenset("open opened close closed closing shut".split())


def _words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())


@dataclass
class ParsedInstruction:
    """Attributes found in an instruction, and the prompt clauses in their original order.

    Clauses are normalised (:func:`~facefuse.prompt.compress.normalize`), ready for
    ``compress(..., normalized=True)``.

    ``clauses`` holds each understood clause rendered from its attributes ("make her smile" ->
    "smiling"), each descriptive clause matched by a rule as written ("studio light"), and
    each clause not (fully) understood verbatim; ``apart`` the clauses that are attributes
    (kept apart by commas in the prompt); ``negatives`` the removed items; ``warnings`` the
    contradictions resolved and what was not understood.
    """

    attributes: dict = field(default_factory=dict)
    clauses: list[str] = field(default_factory=list)
    negatives: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    apart: list[str] = field(default_factory=list)


_FIRST_WORDS = frozenset(
    "please make let keep add give put wear wearing with show remove delete take without no "
    "drop lose get change set turn use in under on against place a an the some him her them it "
    "me us render do as aged age about around dye color colour".split()
)
_LAST_WORDS = frozenset(
    "light lighting lights lit hair eyes background style daylight sunlight moonlight "
    "candlelight sunshine".split()
)


def _match_clause(clause: str) -> tuple[str, str, object] | None:
    """(rule kind, key, value) of the first rule that matches the whole clause, or None."""
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
            return kind, kind, True
        value = match["v"].strip()
        if " with " in f" {value} ":
            return None  # "a woman with red hair": the value would swallow the subject
        if kind == "noun_change":
            return kind, _NOUNS[match["k"]], value
        if kind == "expression_verb":
            return kind, "mood", _EXPRESSION_VERBS[value]
        if kind == "mood":
            return kind, "mood", value
        if kind == "age_rel":
            return kind, "age", value
        if kind in ("item_on", "item_off"):
            noun = "bow tie" if value.endswith("bow tie") else value.split()[-1]
            qualifier = value[: -len(noun)].strip()
            if kind == "item_off":
                return kind, noun, False
            return kind, noun, qualifier or True
        if kind == "age":
            return kind, "age", int(value)
        return kind, kind, value
    return None


def split_clauses(text: str) -> list[str]:
    """Normalised clauses of an instruction: commas, sentence ends, "and then", "然后" ..."""
    text = _CLAUSE_AND.sub(",", text)
    if has_chinese(text):
        text = _ZH_JOIN.sub(",", to_simplified(text))
    clauses = []
    for clause in split_tags(normalize(text)):
        # "studio lighting and a white background": two (not "black and white background")
        masked = _BINOMIAL_RE.sub(lambda m: m.group(0).replace(" and ", " \x05 "), clause)
        found = _match_clause(clause) if " and " in masked else None
        if found is not None and " and " in str(found[2]):
            parts = (p.replace(" \x05 ", " and ").strip() for p in masked.split(" and "))
            clauses.extend(p for p in parts if p)
        else:
            clauses.append(clause)
    return clauses


def _read(clause: str) -> tuple[ClauseReading, bool]:
    """Read one clause: ``(reading, descriptive)``; ``descriptive`` marks a rule match that is
    kept as written in the prompt ("studio light", "no glasses": no edit verb)."""
    found = _match_clause(_POLITE_END.sub("", clause))  # "warm lighting please"
    eye_state = (
        found is not None
        and found[1] == "eyes"
        and not _EYE_STATE_WORDS.isdisjoint(str(found[2]).split())
    )
    descriptive = clause.split(" ", 1)[0] not in EDIT_VERBS
    if found is not None and found[0] in _NOUN_KINDS and not eye_state:
        return ClauseReading(clause, [Event(found[1], found[2])]), descriptive
    reading = read_clause(clause)
    if not reading.events and found is not None and not eye_state:
        # a mood ("make him look surprised") or an item the lexicon does not list
        return ClauseReading(clause, [Event(found[1], found[2])]), descriptive
    if reading.events and reading.residue and not has_chinese(clause):
        rest = _match_clause(" ".join(reading.residue))  # "big smile under soft light"
        if rest is not None and rest[0] in _NOUN_KINDS:
            reading.events.append(Event(rest[1], rest[2], order=len(clause)))
            reading.residue = []
    return reading, False


def parse_instruction(text: str) -> ParsedInstruction:
    """Map an edit instruction (English, Chinese or both) to attributes.

    Understood clauses are rendered from the final attributes, in the words the model was
    trained on; clauses not (fully) understood are kept verbatim, in order (a Chinese one after
    the English rendering of what it asked for: the text tower reads English only). A later
    clause wins over an earlier one, with a warning; an instruction of which nothing was read
    in a language the parser does not know gets a warning and is passed on as written.
    """
    parsed = ParsedInstruction()
    clauses = split_clauses(text)
    readings: list[tuple[ClauseReading, bool]] = []
    events: list[Event] = []
    for index, clause in enumerate(clauses):
        reading, descriptive = _read(clause)
        for event in reading.events:
            event.clause = index
        events.extend(reading.events)
        readings.append((reading, descriptive))
    attributes, decided, warnings = resolve(events, clauses)
    parsed.attributes = attributes
    parsed.warnings = warnings
    parsed.negatives = [k for k, v in attributes.items() if v is False]
    described: list[str] = []
    by_clause: dict[int, list[str]] = {}
    for key, event in decided.items():
        if event.value is not False:
            by_clause.setdefault(event.clause, []).append(key)
    for index, (reading, descriptive) in enumerate(readings):
        keys = sorted(by_clause.get(index, []), key=_order_key)
        rendered = [_render_one(k, attributes[k]) for k in keys]  # from normalised text
        if reading.understood and descriptive:
            parsed.clauses.append(reading.text)  # as written: "studio light", "red hair"
            described.append(reading.text)
        elif reading.understood:
            parsed.clauses.extend(rendered)
            parsed.apart.extend(rendered)
        else:
            if has_chinese(reading.text):  # the text tower reads English only
                said = set(_words(reading.text))
                extra = [r for r in rendered if not set(_words(r)) <= said]
                parsed.clauses.extend(extra)
                parsed.apart.extend(extra)
            parsed.clauses.append(reading.text)
            if reading.events and has_chinese(reading.text):
                parsed.warnings.append(
                    f"not understood in {reading.text!r}: {''.join(reading.residue)!r}; "
                    "kept as written"
                )
    if parsed.apart:  # an edit instruction: its descriptive attributes are tags of their own
        parsed.apart.extend(described)  # (a description alone keeps the compact join)
    if not events:
        why = unknown_language(text)
        if why is not None:
            parsed.warnings.append(
                f"nothing in the instruction was understood ({why}; the parser reads English "
                "and Chinese): it is passed on as written and no face edit is applied"
            )
    else:
        for reading, _ in readings:
            why = None if reading.events else unknown_language(reading.text)
            if why is not None:
                parsed.warnings.append(f"not understood ({why}): {reading.text!r}")
    return parsed


def _order_key(key: str) -> int:
    return ORDER.index(key) if key in ORDER else len(ORDER)


def _canonical_expression(value) -> str | None:
    """A canonical expression for an attribute value ("laughing" -> "big smile"), or None."""
    if not isinstance(value, str):
        return None
    if value in lx.EXPRESSIONS:
        return value
    found = parse_instruction(value).attributes.get("expression")
    return found if found in lx.EXPRESSIONS else None


def expression_edit(attributes: dict) -> dict:
    """The face warp's parameters for an attribute dict: ``{"reset", "smile", "mouth_open"}``.

    ``smile``: 0.5 for a slight smile, 1.0 for smiling, 1.5 for a big smile, else 0.0;
    ``reset``: True for a neutral expression (a negated smile), which undoes A's own smile;
    ``mouth_open``: 1.0 for ``expression: "open mouth"`` or ``mouth: "open"``, else 0.0.
    Nothing asked gives ``{"reset": False, "smile": 0.0, "mouth_open": 0.0}``. A value that is
    not canonical is read like an instruction ("laughing" -> big smile). Pure: no I/O, no state.
    """
    expression = _canonical_expression(attributes.get("expression"))
    mouth = attributes.get("mouth")
    return {
        "reset": expression == lx.NEUTRAL,
        "smile": SMILE_STRENGTH.get(expression, 0.0),
        "mouth_open": 1.0 if expression == lx.OPEN_MOUTH or mouth == "open" else 0.0,
    }


SMILE_STRENGTH = {lx.SLIGHT_SMILE: 0.5, lx.SMILING: 1.0, lx.BIG_SMILE: 1.5}


def _render_one(key: str, value) -> str:
    if isinstance(value, str) and (key, value) in CANONICAL_TEXT:
        return CANONICAL_TEXT[(key, value)]
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


def _said(key: str, value) -> str:
    """The words a rendered attribute must show: its value, or its canonical caption."""
    if value is True:
        return key
    if isinstance(value, str) and (key, value) in CANONICAL_TEXT:
        return CANONICAL_TEXT[(key, value)]
    return str(value)


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
        and not set(_words(_said(k, attributes[k]))) <= set(_words(prompt))
    ]
    if missing:  # cannot happen with the rules above; guards future edits
        raise RuntimeError(f"attributes lost while rendering: {missing}")
    return prompt, negatives
