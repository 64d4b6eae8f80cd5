"""Instruction understanding: English and Chinese clauses -> attribute events -> attributes.

A clause ("make her smile", "别笑", "close her eyes") is read against the lexicon of
:mod:`facefuse.prompt.lexicon`:

* English: eyes and mouth states are regexes first ("close her eyes" -> one ``eyes_closed``
  word), then the words are matched longest phrase first (``"get rid of"`` before ``"get"``).
* Chinese has no spaces: lexicon phrases are matched as substrings, longest first, left to
  right (forward maximum matching), so "不要笑" reads 不要 + 笑 and "不苟言笑" stays one word.

Each clause gives :class:`Event` s (key, value) and the words it did not understand. Negators
and removal verbs (no, don't, stop, remove / 不, 别, 不要, 没有, 去掉 ...) before a target flip
it: a negated smile is ``neutral expression``, a negated item is ``False``, "don't close the
eyes" is ``eyes: open``; two flips cancel ("don't remove the glasses"). Smile strength comes
from modifiers around the smile word (slight/small/a bit/微微/稍微 -> ``slight smile``,
big/broad/wide/灿烂/哈哈 -> ``big smile``).

Traditional characters are read as simplified (:func:`to_simplified`). A clause with no
target of its own amends the one before: "no, don't" negates it, "make it subtle" sets its
smile's strength, "actually keep them" / "还是留着吧" keeps the item named last, "open them
again" sets the part named last.

:func:`resolve` folds the events of all clauses in order: a later clause wins, and each
override is reported as a warning. Expression and mouth are one axis: a smile keeps an
open-mouth request as ``mouth: "open"``, an open mouth alone is ``expression: "open mouth"``,
a neutral expression clears an earlier open mouth and an open mouth clears an earlier neutral.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from facefuse.prompt import lexicon as lx

# --- tables ----------------------------------------------------------------------------------

PART_PREVIOUS = "<part named before>"  # "open them again": the eyes or mouth before


def _en_table() -> dict[tuple[str, ...], tuple[str, object]]:
    table: dict[tuple[str, ...], tuple[str, object]] = {}

    def put(phrases, kind, value=None):
        for phrase in phrases:
            table[tuple(phrase.split())] = (kind, value)

    put(lx.EN_FILLERS, "filler")
    put(lx.EN_KEEPERS, "keep")
    for phrase, mod in lx.EN_SMILE_MODS.items():
        put([phrase], "mod", mod)
    put(lx.EN_NEGATORS, "neg")
    for phrase, key in lx.EN_ITEMS.items():
        put([phrase], "item", key)
    for phrase, key in lx.EN_ITEMS_ABSENT.items():
        put([phrase], "item", (key, False))
    for phrase, base in lx.EN_SMILE_WORDS.items():
        put([phrase], "smile", base)
    put(lx.EN_NEUTRAL_WORDS, "neutral")
    for phrase in lx.EN_STYLES:
        put([phrase], "style", lx.BLACK_AND_WHITE)
    for _, token in lx.EN_STATE_PATTERNS:
        key, value = token.split("_")
        put([token], "state", (PART_PREVIOUS if key == "ref" else key, value))
    for phrase, value in lx.EN_AGE.items():
        put([phrase], "age", value)
    put(lx.EN_REFERENCES, "ref")
    put(lx.EN_POST_NEGATORS, "postneg")
    return table


def _zh_table() -> dict[str, tuple[str, object]]:
    table: dict[str, tuple[str, object]] = {}
    for word in lx.ZH_FILLERS:
        table[word] = ("filler", None)
    for word in lx.ZH_KEEPERS:
        table[word] = ("keep", None)
    for word in lx.ZH_NEGATORS:
        table[word] = ("neg", None)
    for word, value in lx.ZH_SMILE_MODS.items():
        table[word] = ("mod", value)
    for word, value in lx.ZH_LIGHT_MODS.items():
        table[word] = ("lightmod", value)
    for word in lx.ZH_LIGHT_NOUNS:
        table[word] = ("lightnoun", None)
    for mod, value in lx.ZH_LIGHT_MODS.items():  # "自然光线", "暖色灯光": one word each
        for noun in lx.ZH_LIGHT_NOUNS:
            table[mod + noun] = ("light", value)
    for word, value in lx.ZH_LIGHT.items():
        table[word] = ("light", value)
    for word, value in lx.ZH_COLOURS.items():
        table[word] = ("colour", value)
    for word in lx.ZH_BACKGROUND:
        table[word] = ("background", None)
    table["白底"] = ("background", "white")
    for word, key in lx.ZH_ITEMS.items():
        table[word] = ("item", key)
    for word, value in lx.ZH_HAIR.items():
        table[word] = ("hair", value)
    for word, value in lx.ZH_AGE.items():
        table[word] = ("age", value)
    for word in lx.ZH_STYLES:
        table[word] = ("style", lx.BLACK_AND_WHITE)
    for word, part in lx.ZH_PARTS.items():
        table[word] = ("part", part)
    for word, state in lx.ZH_PART_STATES.items():
        table[word] = ("partstate", state)
    for word, value in lx.ZH_EYES.items():
        table[word] = ("state", ("eyes", value))
    for word, value in lx.ZH_MOUTH.items():
        table[word] = ("state", ("mouth", value))
    for word, base in lx.ZH_SMILE_WORDS.items():
        table[word] = ("smile", base)
    for word in lx.ZH_NEUTRAL_WORDS:
        table[word] = ("neutral", None)
    for word in lx.ZH_EXPRESSION_NOUNS:
        table[word] = ("exprnoun", None)
    return table


# Traditional characters of the lexicon's words -> simplified ("別笑，保留眼鏡" reads as
# "别笑，保留眼镜"); generated once from OpenCC's tables (zh_traditional.json says how).
_TRADITIONAL = str.maketrans(
    json.loads(Path(__file__).with_name("zh_traditional.json").read_text(encoding="utf-8"))["map"]
)


def to_simplified(text: str) -> str:
    """``text`` with the traditional characters the lexicon knows in their simplified form."""
    return text.translate(_TRADITIONAL)


EN_TABLE = _en_table()
EN_MAX = max(len(k) for k in EN_TABLE)
ZH_TABLE = _zh_table()
ZH_MAX = max(len(k) for k in ZH_TABLE)
_STATE_RES = tuple((re.compile(p), token) for p, token in lx.EN_STATE_PATTERNS)
_EN_POST_MODS = frozenset(
    "slightly bit little more widely broadly softly gently faintly subtly shyly warmly wide big "
    "broad bigger wider brighter".split()
) | {"ear to ear", "with teeth", "showing teeth", "teeth"}
_EN_POST_REMOVE = frozenset({"removed", "off", "gone", "away"})
REFERENCE = "<previous item>"  # key of "keep them": resolved to the last item named
NEGATE_PREVIOUS = "<negate previous>"  # "smile. no, don't": the clause before, negated
STRENGTH_PREVIOUS = "<smile strength>"  # "grin, wait, make it subtle": the smile before
LIGHT_PREVIOUS = "<more lighting>"  # "灯光柔和一些，自然一点": the lighting before, qualified
_BARE_NEGATORS = frozenset({"don't", "dont", "do not", "not", "never", "不要", "别", "不"})
_ITEM_KEYS = frozenset(lx.EN_ITEMS.values()) | frozenset(lx.ZH_ITEMS.values())
# a clause that starts with one of these is an edit request: its person nouns are the target
_EDIT_START = frozenset("make let give please can could would keep have get turn put show".split())
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_EN_WORD = re.compile(r"[^\s,.;:!?\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_FLIP_STATE = {"open": "closed", "closed": "open"}
_STRENGTH = {lx.SLIGHT_SMILE: 0, lx.SMILING: 1, lx.BIG_SMILE: 2}


@dataclass
class Event:
    """One attribute a clause asks for; ``order`` sorts events across the instruction."""

    key: str
    value: object
    clause: int = 0
    order: int = 0
    bare: bool = False  # an item with no verb in its clause ("remove the hat and the scarf")


@dataclass
class ClauseReading:
    """What one clause says: its events and the words (or Chinese characters) not read."""

    text: str
    events: list[Event] = field(default_factory=list)
    residue: list[str] = field(default_factory=list)

    @property
    def understood(self) -> bool:
        return bool(self.events) and not self.residue


# --- English ---------------------------------------------------------------------------------


def _negated_state(span: str, token: str) -> str:
    if not _STATE_NEGATION.search(span):
        return token
    part, state = token.split("_")
    return f"{part}_{_FLIP_STATE[state]}"


_STATE_NEGATION = re.compile(r"\b(?:not|never)\b|n't\b")


def _en_tokens(text: str) -> list[tuple[str, object, str, int]]:
    """(kind, value, word, offset) per lexicon phrase or unknown word, longest phrase first."""
    for pattern, token in _STATE_RES:
        if pattern.search(text):  # "eyes should not be closed": the state between, negated
            text = pattern.sub(lambda m, t=token: f" {_negated_state(m.group(0), t)} ", text)
    words = [(m.group(0).strip("'\"-"), m.start()) for m in _EN_WORD.finditer(text)]
    words = [(w, o) for w, o in words if w]
    out = []
    i = 0
    while i < len(words):
        for n in range(min(EN_MAX, len(words) - i), 0, -1):
            phrase = tuple(w for w, _ in words[i : i + n])
            entry = EN_TABLE.get(phrase)
            if entry is not None:
                out.append((entry[0], entry[1], " ".join(phrase), words[i][1]))
                i += n
                break
        else:
            out.append(("word", None, words[i][0], words[i][1]))
            i += 1
    return out


def read_english(text: str, follow_up: bool = True, flips: int = 0) -> ClauseReading:
    """Events and unread words of one normalised English clause (Chinese characters skipped).

    ``follow_up=False``: a clause without a target of its own is not read as amending the
    clause before (the English part of "remove 眼镜": its target is in the Chinese part);
    ``flips``: negators read before the English part ("不要 smile")."""
    tokens = _en_tokens(text)
    reading = ClauseReading(text)
    if not tokens:
        return reading
    person_fillers = tokens[0][2] in _EDIT_START
    used: set[int] = set()
    verb = flips > 0
    last_item: bool | None = None
    pending_mods: list[int] = []
    last_smile: Event | None = None
    reference: tuple[int, Event] | None = None
    for i, (kind, value, _word, offset) in enumerate(tokens):
        if kind == "neg":
            flips += 1
            verb = True
            used.add(i)
        elif kind == "keep":
            verb = True
            used.add(i)
        elif kind == "mod":
            pending_mods.append(i)
        elif kind == "age":
            used.add(i)
            reading.events.append(Event("age", value, order=offset))
        elif kind == "ref" and verb and last_item is None and reference is None:
            reference = (i, Event(REFERENCE, flips % 2 == 0, order=offset))
        elif kind in ("smile", "neutral", "state", "item", "style"):
            positive = flips % 2 == 0
            used.add(i)
            event = None
            if kind == "smile":
                mods = [j for j in pending_mods if j not in used]
                mods += _post_mods(tokens, i, used)
                used.update(mods)
                strength = _apply_mods(str(value), [str(tokens[j][1]) for j in mods])
                post = _next_word(tokens, i)
                if post is not None and _removes(tokens[post]):
                    positive = False  # "take the smile away", "wipe the grin off"
                    used.add(post)
                if not positive:
                    event = Event("expression", lx.NEUTRAL, order=offset)
                    last_smile = None
                elif last_smile is not None and flips == 0:
                    last_smile.value = _stronger(str(last_smile.value), strength)
                else:
                    event = Event("expression", strength, order=offset)
                    last_smile = event
            elif kind == "neutral":
                if positive:
                    event = Event("expression", lx.NEUTRAL, order=offset)
                    last_smile = None
                else:
                    used.discard(i)  # "not serious": not read
            elif kind == "state":
                key, state = value  # type: ignore[misc]
                event = Event(key, state if positive else _FLIP_STATE[state], order=offset)
            elif kind == "item":
                if not verb and flips == 0 and last_item is not None:
                    positive = last_item  # "remove the glasses and hat": the same verb
                post = _next_word(tokens, i)
                if post is not None and _removes(tokens[post]):
                    positive = False  # "glasses off", "shave his beard off", "have to go"
                    used.add(post)
                elif post is not None and tokens[post][2] == "on":
                    used.add(post)
                bare = not verb and flips == 0 and last_item is None
                if isinstance(value, tuple):  # "clean-shaven": an item named absent
                    value, absent = value
                    positive = positive == absent
                    bare = False
                last_item = positive
                item_value: object = positive
                if positive:
                    qualifier = _qualifier(tokens, i, used)
                    if qualifier:
                        item_value = qualifier
                event = Event(str(value), item_value, order=offset, bare=bare)
            elif kind == "style":
                if positive:
                    event = Event("style", value, order=offset)
                else:
                    used.discard(i)
            if event is not None:
                reading.events.append(event)
            flips = 0
            verb = False
            pending_mods = []
    if reference is not None and not reading.events:
        used.add(reference[0])  # "actually keep them": the item named last, in a past clause
        reading.events.append(reference[1])
    if follow_up and not reading.events:
        _follow_up(tokens, used, reading)
    for i, (kind, _, word, _) in enumerate(tokens):
        if i in used or kind in ("filler", "keep", "neg"):
            continue
        if kind in ("mod", "ref", "postneg") and word in lx.EN_FILLERS:
            continue
        if person_fillers and word in lx.IDENTITY_NOUNS:
            continue
        reading.residue.append(word)
    return reading


def _follow_up(tokens, used: set[int], reading: ClauseReading) -> None:
    """A clause with no target of its own that amends the one before: only a negator
    ("no, don't", "不要") negates it, only a smile strength ("make it subtle", "bigger")
    changes the smile's; a verb alone ("还是留着吧") keeps or removes the item named last."""
    kinds = [t[0] for t in tokens]
    if any(k not in ("filler", "neg", "keep", "mod", "word", "ref", "postneg") for k in kinds):
        return
    words = [t[2] for t in tokens if t[0] == "word"]
    mods = [i for i, t in enumerate(tokens) if t[0] == "mod" and t[1] in ("slight", "big")]
    negs = [t[2] for t in tokens if t[0] == "neg"]
    offset = tokens[0][3] if tokens else 0
    if words:
        return
    if mods and not negs:
        used.update(mods)
        strength = "big" if any(tokens[i][1] == "big" for i in mods) else "slight"
        reading.events.append(Event(STRENGTH_PREVIOUS, strength, order=offset))
    elif negs and not mods and "keep" not in kinds and any(n in _BARE_NEGATORS for n in negs):
        # "no, actually don't": an interjection "no" does not cancel the negator
        reading.events.append(Event(NEGATE_PREVIOUS, True, order=offset))
    elif ("keep" in kinds or negs) and not mods:  # "还是留着吧", "还是摘掉吧"
        reading.events.append(Event(REFERENCE, len(negs) % 2 == 0, order=offset))


def _post_mods(tokens, i: int, used: set[int]) -> list[int]:
    """Modifiers right after a smile word ("smile slightly", "smile a bit more")."""
    found = []
    for j in range(i + 1, len(tokens)):
        kind, _, word, _ = tokens[j]
        if kind == "mod" and word in _EN_POST_MODS and j not in used:
            found.append(j)
        elif kind not in ("filler", "mod"):
            break
    return found


def _next_word(tokens, i: int) -> int | None:
    j = i + 1
    return j if j < len(tokens) and tokens[j][0] in ("word", "filler", "postneg") else None


def _removes(token) -> bool:
    return token[0] == "postneg" or token[2] in _EN_POST_REMOVE


def _qualifier(tokens, i: int, used: set[int]) -> str:
    """Up to two plain words right before an item ("round glasses", "long red hair")."""
    words: list[int] = []
    j = i - 1
    while j >= 0 and len(words) < 2:
        kind, _, word, _ = tokens[j]
        if kind == "word" and word.isalpha() and j not in used:
            words.insert(0, j)
            j -= 1
        else:
            break
    used.update(words)
    return " ".join(tokens[j][2] for j in words)


def _apply_mods(base: str, mods: list[str]) -> str:
    if "big" in mods:
        return lx.BIG_SMILE
    if "slight" in mods:
        return lx.SLIGHT_SMILE
    return base


def _stronger(a: str, b: str) -> str:
    return a if _STRENGTH.get(a, 1) >= _STRENGTH.get(b, 1) else b


# --- Chinese ---------------------------------------------------------------------------------


def _zh_tokens(text: str) -> list[tuple[str, object, str, int]]:
    """Forward maximum matching over the Chinese characters of ``text``; other text skipped."""
    out = []
    i = 0
    while i < len(text):
        if not _HAN.match(text[i]):
            i += 1
            continue
        for n in range(min(ZH_MAX, len(text) - i), 0, -1):
            entry = ZH_TABLE.get(text[i : i + n])
            if entry is not None:
                out.append((entry[0], entry[1], text[i : i + n], i))
                i += n
                break
        else:
            out.append(("word", None, text[i], i))
            i += 1
    return out


def _pair_parts(tokens: list) -> list:
    """Join a part (眼睛, 嘴巴) and its state verb (闭, 张开) in either order into one state
    token at the verb ("眼睛闭起来", "嘴巴微微张开"); a part left alone is a filler."""
    tokens = list(tokens)
    parts = [i for i, t in enumerate(tokens) if t[0] == "part"]
    for i, (kind, value, _word, offset) in enumerate(tokens):
        if kind != "partstate" or not parts:
            continue
        before = [j for j in parts if j < i]
        j = before[-1] if before else parts[0]
        parts.remove(j)
        tokens[i] = ("state", (tokens[j][1], value), tokens[j][2] + _word, offset)
        tokens[j] = ("filler", None, tokens[j][2], tokens[j][3])
    return [("filler", None, t[2], t[3]) if t[0] == "part" else t for t in tokens]


_ZH_TARGETS = frozenset(
    {"lightnoun", "light", "background", "hair", "age", "style", "state", "item", "smile"}
) | {"neutral"}


def read_chinese(text: str, flips: int = 0, verb: bool = False) -> ClauseReading:
    """Events and unread characters of the Chinese part of one normalised clause.

    ``flips`` and ``verb``: negators and verbs read before the Chinese part ("remove 眼镜")."""
    tokens = _pair_parts(_zh_tokens(text))
    reading = ClauseReading(text)
    used: set[int] = set()
    last_item: bool | None = None
    smiles: list[Event] = []
    light_mods: list[int] = []
    light_nouns: list[int] = []
    colours: list[int] = []
    bare: list[tuple[int, Event]] = []  # targets with no verb before them ("眼镜不要了")
    for i, (kind, value, _word, offset) in enumerate(tokens):
        event = None
        target = kind in _ZH_TARGETS
        if kind == "neg":
            flips += 1
            verb = True
        elif kind == "keep":
            verb = True
        elif kind == "exprnoun" and flips % 2:  # "不要有任何表情": a neutral expression
            target = True
            event = Event("expression", lx.NEUTRAL, order=offset)
            smiles.clear()
        elif kind == "lightmod":
            light_mods.append(i)
        elif kind == "colour":
            colours.append(i)
            if reading.events and reading.events[-1].key == "background":
                reading.events[-1].value = value  # "背景换成白色"
                used.add(i)
        elif kind == "lightnoun":
            mods = [j for j in light_mods if j not in used]
            if mods:
                used.update(mods)
                names = list(dict.fromkeys(str(tokens[j][1]) for j in mods))
                event = Event("lighting", " ".join(names), order=offset)
            else:
                light_nouns.append(i)  # "光线柔和一些": the qualifier may follow
                target = False
        elif kind == "light":
            mods = [j for j in light_mods if j not in used]
            used.update(mods)
            names = list(dict.fromkeys([*(str(tokens[j][1]) for j in mods), str(value)]))
            event = Event("lighting", " ".join(names), order=offset)
        elif kind == "background":
            before = [j for j in colours if j not in used]
            if before:
                used.add(before[-1])
            colour = tokens[before[-1]][1] if before else value
            event = Event("background", colour if colour else True, order=offset)
        elif kind == "hair":
            event = Event("hair", value, order=offset)
        elif kind == "age":
            event = Event("age", value, order=offset)
        elif kind == "style":
            event = Event("style", value, order=offset) if flips % 2 == 0 else None
        elif kind == "state":
            key, state = value  # type: ignore[misc]
            positive = flips % 2 == 0
            event = Event(key, state if positive else _FLIP_STATE[state], order=offset)
        elif kind == "item":
            positive = flips % 2 == 0
            lone = not verb and flips == 0 and last_item is None
            if not verb and flips == 0 and last_item is not None:
                positive = last_item
            last_item = positive
            before = [j for j in colours if j not in used]
            if value == "hair" and before and positive:
                used.add(before[-1])
                event = Event("hair", tokens[before[-1]][1], order=offset)
            else:
                event = Event(str(value), positive, order=offset, bare=lone)
        elif kind == "smile":
            if flips % 2:
                event = Event("expression", lx.NEUTRAL, order=offset)
                smiles.clear()
            elif smiles and flips == 0:
                smiles[-1].value = _stronger(str(smiles[-1].value), str(value))
                if not verb:
                    bare.append((i, smiles[-1]))
            else:
                event = Event("expression", value, order=offset)
                smiles.append(event)
        elif kind == "neutral":
            if flips % 2 == 0:
                event = Event("expression", lx.NEUTRAL, order=offset)
                smiles.clear()
            else:
                target = False
        if target:
            used.add(i)
            if event is not None and not verb:
                bare.append((i, event))
            flips = 0
            verb = False
        if event is not None:
            reading.events.append(event)
    _trailing_negation(tokens, bare, smiles)
    if not reading.events:
        _follow_up(tokens, used, reading)
    if (
        not reading.events and light_mods and all(t[0] in ("lightmod", "filler") for t in tokens)
    ):  # "灯光柔和一些，自然一点": the lighting before, qualified again
        used.update(light_mods)
        names = [str(tokens[j][1]) for j in light_mods]
        reading.events.append(Event(LIGHT_PREVIOUS, " ".join(names), order=tokens[0][3]))
    if light_nouns and not any(e.key == "lighting" for e in reading.events):
        mods = [j for j in light_mods if j not in used and j > light_nouns[0]]
        if mods:
            used.update([*mods, light_nouns[0]])
            names = list(dict.fromkeys(str(tokens[j][1]) for j in mods))
            offset = tokens[light_nouns[0]][3]
            reading.events.append(Event("lighting", " ".join(names), order=offset))
    if smiles:  # modifiers anywhere in the clause set the strength ("笑得灿烂一点")
        mods = [j for j, t in enumerate(tokens) if t[0] == "mod" and j not in used]
        soft = [j for j in light_mods if j not in used]  # "柔和的微笑": a gentle smile
        used.update(mods + soft)
        names = [str(tokens[j][1]) for j in mods] + [
            "slight" for j in soft if tokens[j][1] == "soft"
        ]
        for event in smiles:
            event.value = _apply_mods(str(event.value), names) if names else event.value
    for i, (kind, _, word, _) in enumerate(tokens):
        if i not in used and kind not in ("filler", "keep", "neg", "exprnoun"):
            reading.residue.append(word)
    return reading


def _trailing_negation(tokens: list, bare: list[tuple[int, Event]], smiles: list[Event]) -> None:
    """A removal after the last target applies to it ("眼镜不要了", "把笑容去掉")."""
    if not bare:
        return
    targets = [i for i, t in enumerate(tokens) if t[0] in _ZH_TARGETS]
    last = targets[-1] if targets else -1
    negs = [i for i, t in enumerate(tokens) if t[0] == "neg" and i > last]
    index, event = bare[-1]
    if not negs or index != last or len(negs) % 2 == 0:
        return
    if event.key == "expression" and event.value in lx.SMILES:
        event.value = lx.NEUTRAL
        if event in smiles:
            smiles.remove(event)
    elif event.key in ("eyes", "mouth") and event.value in _FLIP_STATE:
        event.value = _FLIP_STATE[str(event.value)]
    elif event.value is True:
        event.value = False


# --- clauses, resolution, languages ------------------------------------------------------------


def read_clause(text: str) -> ClauseReading:
    """Read a normalised clause: its Chinese characters and its other words."""
    if _HAN.search(text):
        head = re.split(r"[a-z]", text, maxsplit=1)[0]  # Chinese negators first: "不要 smile"
        zh_head = _zh_tokens(head) if _HAN.search(head) else []
        head_flips = 0
        if zh_head and all(t[0] in ("neg", "keep", "filler") for t in zh_head):
            head_flips = [t[0] for t in zh_head].count("neg")
        en = read_english(_HAN.sub(" ", text), follow_up=False, flips=head_flips)
        lead = _HAN.split(text, 1)[0]  # English verbs before the Chinese: "remove 眼镜"
        flips = verb = 0
        if not en.events and lead.strip():
            kinds = [t[0] for t in _en_tokens(lead)]
            flips, verb = kinds.count("neg"), ("neg" in kinds or "keep" in kinds)
        zh = read_chinese(text, flips, bool(verb))
        reading = ClauseReading(text, zh.events + en.events, zh.residue + en.residue)
        reading.events.sort(key=lambda e: e.order)
        return reading
    return read_english(text)


def has_chinese(text: str) -> bool:
    return bool(_HAN.search(text))


def _describe(event: Event) -> str:
    return f"{event.key}: {event.value}"


def _amend(events: list[Event]) -> list[Event]:
    """Resolve the follow-up events against the events before them: "keep them" (the item
    named last), "don't" (the last event negated), "make it subtle" (the last smile's
    strength); a follow-up with nothing before it is dropped."""
    out: list[Event] = []
    for event in events:
        if event.key == REFERENCE:
            items = [e for e in out if e.key in _ITEM_KEYS]
            if items:
                out.append(Event(items[-1].key, event.value, event.clause, event.order))
        elif event.key == NEGATE_PREVIOUS:
            negated = _negated(out[-1]) if out else None
            if negated is not None:
                out.append(Event(negated.key, negated.value, event.clause, event.order))
        elif event.key == PART_PREVIOUS:
            parts = [e for e in out if e.key in ("eyes", "mouth")]
            if parts:
                out.append(Event(parts[-1].key, event.value, event.clause, event.order))
        elif event.key == LIGHT_PREVIOUS:
            lights = [e for e in out if e.key == "lighting" and isinstance(e.value, str)]
            if lights:
                words = list(dict.fromkeys([*str(lights[-1].value).split(), event.value]))
                out.append(Event("lighting", " ".join(words), event.clause, event.order))
        elif event.key == STRENGTH_PREVIOUS:
            smiles = [e for e in out if e.key == "expression"]
            if smiles and smiles[-1].value in lx.SMILES:
                value = lx.BIG_SMILE if event.value == "big" else lx.SLIGHT_SMILE
                out.append(Event("expression", value, event.clause, event.order))
        elif (
            event.bare
            and event.value is True
            and out
            and out[-1].key in _ITEM_KEYS
            and out[-1].value is False
            and out[-1].clause == event.clause - 1
        ):  # "remove the earrings, and the necklace": the same verb
            out.append(Event(event.key, False, event.clause, event.order))
        else:
            out.append(event)
    return out


def _negated(event: Event) -> Event | None:
    if event.key == "expression":
        return Event("expression", lx.NEUTRAL) if event.value in lx.SMILES else None
    if event.key in ("eyes", "mouth") and event.value in _FLIP_STATE:
        return Event(event.key, _FLIP_STATE[str(event.value)])
    if event.key in _ITEM_KEYS:
        return Event(event.key, event.value is False)
    return None


def resolve(events: list[Event], sources: list[str]) -> tuple[dict, dict[str, Event], list[str]]:
    """Fold events in order: ``(attributes, deciding event per key, warnings)``.

    ``sources`` are the clause texts, to name them in a warning. A later event overrides an
    earlier one of the same key (expression and mouth: the same axis) and the override is
    reported once per pair of clauses.
    """
    events = _amend(sorted(events, key=lambda e: (e.clause, e.order)))
    final: dict[str, Event] = {}
    warnings: list[str] = []
    expression: Event | None = None
    mouth: Event | None = None

    def contradiction(old: Event, new: Event) -> None:
        if old.clause == new.clause and old.key == new.key:
            where = f"in {sources[new.clause]!r}"
        else:
            where = f"{sources[old.clause]!r} then {sources[new.clause]!r}"
        warnings.append(
            f"contradiction: {where} ({_describe(old)} vs {_describe(new)}); the later clause "
            f"wins: {_describe(new)}"
        )

    for event in events:
        if event.key == "expression" and event.value in lx.EXPRESSIONS:
            if expression is not None and expression.value != event.value:
                contradiction(expression, event)
            expression = event
            if event.value == lx.NEUTRAL and mouth is not None and mouth.value == "open":
                mouth = None
        elif event.key == "mouth":
            if mouth is not None and mouth.value != event.value:
                contradiction(mouth, event)
            mouth = event
            if event.value == "open" and expression is not None and expression.value == lx.NEUTRAL:
                contradiction(expression, event)
                expression = None
        else:
            old = final.get(event.key)
            if old is not None and old.value != event.value:
                contradiction(old, event)
            final[event.key] = event
    axis: dict[str, Event] = {}
    if expression is not None:
        axis["expression"] = expression
        if mouth is not None and (expression.value != lx.NEUTRAL or mouth.value == "closed"):
            axis["mouth"] = mouth
    elif mouth is not None:
        if mouth.value == "open":
            axis["expression"] = Event("expression", lx.OPEN_MOUTH, mouth.clause, mouth.order)
        else:
            axis["mouth"] = mouth
    decided = {**axis, **final}
    attributes = {key: event.value for key, event in decided.items()}
    return attributes, decided, warnings


# Latin words an English instruction is made of; a Latin-script text with no attribute and
# fewer than half of its words here reads as another language ("souris").
_ENGLISH = (
    lx.FUNCTION_WORDS
    | lx.META_WORDS
    | lx.IDENTITY_NOUNS
    | lx.MEDIUM_NOUNS
    | lx.EN_FILLERS
    | {w for phrase in EN_TABLE for w in phrase}
)


def unknown_language(text: str) -> str | None:
    """Why ``text`` reads as a language the parser does not know, or None.

    Letters of a script other than Latin and Chinese (Cyrillic, Arabic, kana ...), Latin
    letters with diacritics ("plaît", "lächeln"), or function words of another language
    ("por favor", "bitte") among Latin words of which fewer than half are English words the
    parser knows. An English text the parser reads nothing in ("red tower") is not flagged."""
    scripts = set()
    for ch in text:
        if ch.isalpha() and not _HAN.match(ch):
            name = unicodedata.name(ch, "")
            if not name.startswith("LATIN"):
                scripts.add(name.split(" ")[0].title() or "unknown")
            elif not ch.isascii():
                scripts.add("Latin with diacritics")
    if scripts:
        return f"script {', '.join(sorted(scripts))}"
    words = re.findall(r"[a-z']+", text.lower())
    foreign = [w for w in words if w in lx.FOREIGN_FUNCTION_WORDS and w not in _ENGLISH]
    if foreign and sum(w in _ENGLISH for w in words) * 2 < len(words):
        return f"words that are not English: {', '.join(dict.fromkeys(foreign))}"
    return None
