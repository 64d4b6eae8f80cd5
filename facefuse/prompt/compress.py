"""Prompt compression that keeps meaning: fewer CLIP tokens, same subjects, attributes and styles.

The steps, each a pure function of the text (deterministic, no network, no model):

1. :func:`normalize` — Unicode NFKC, lower case (CLIP lower-cases anyway), full-width
   punctuation, "8 k" -> "8k", "wet - on - wet" -> "wet-on-wet" (same CLIP tokens, one word).
2. :func:`split_tags` — comma/semicolon/sentence/bracket separated tags.
3. per tag: meta instructions ("please create", "I'd like", "the picture should show": the
   medium named, "picture", stays) and fillers ("kind of", "in the style of X" -> "X style",
   or just "X" when X is a medium such as "watercolor painting", "portrait of X" -> "portrait
   X", "looks about 35 years old" -> "35 years old", "looking directly at" -> "looking at",
   "a pair of", "X in the background"
   -> "X background") are rewritten, "close-up" becomes "closeup" (one CLIP token); quality
   boilerplate is mapped to one canonical set (:data:`~facefuse.prompt.lexicon.BOILERPLATE`),
   each class once, in its canonical form when that has fewer CLIP tokens than the user's
   wording, else as written ("ultra detailed" -> "detailed", "high quality" and "hd" stay);
   articles, pronouns, auxiliaries, "with" and "and" (outside fixed expressions such as
   "black and white") are dropped.
4. repeated tags are removed (also a one-word tag that another tag holds), the first short
   tag naming the subject is moved first (not one where the identity noun qualifies a part,
   "fashion model face").
5. tags are joined. A comma costs one CLIP token per tag (17% of the tokens of real tag
   prompts), so the compact join uses a space and keeps commas only where items would blur
   (see :func:`join_tags`); ``separator=", "`` keeps every comma.

Content words (see :mod:`facefuse.prompt.evaluate`) are never dropped except as duplicates,
canonicalised boilerplate or the meta and filler phrasing of step 3; every duplicate dropped is
reported in :attr:`Compression.removed`.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field

from facefuse.prompt.lexicon import (
    ART_SITES,
    BINOMIALS,
    BOILERPLATE,
    DROP_ALWAYS,
    FUNCTION_WORDS,
    IDENTITY_NOUNS,
    MEDIUM_NOUNS,
    NEGATIONS,
    TAG_ONLY,
)
from facefuse.prompt.tokenizer import count_tokens, embedded_tokenizer

SEPARATORS = ("compact", ", ", " ")
IDENTITY_TAG_MAX_WORDS = 6  # a longer tag is a scene, not an identity attribute

_PUNCT_MAP = str.maketrans(
    {
        "，": ",",
        "、": ",",
        "；": ";",
        "。": ".",
        "：": ":",
        "！": "!",
        "？": "?",
        "“": " ",
        "”": " ",
        '"': " ",
        "‘": "'",
        "’": "'",
        "`": " ",
        "…": ".",
        "(": " ",
        ")": " ",
        "[": " ",
        "]": " ",
        "{": " ",
        "}": " ",
        "<": " ",
        ">": " ",
        "*": " ",
        "~": " ",
        "#": " ",
        "_": " ",
        "\\": " ",
        "=": " ",
        "^": " ",
    }
)
# A1111 weighted emphasis "(red hair:1.2)" is kept verbatim as one tag.
_WEIGHTED = re.compile(r"\(([^()]{1,200}?):\s*(\d+(?:\.\d+)?)\)")
# The lookahead lets the scan skip most positions fast; split_tags strips the spaces around.
_TAG_SPLIT = re.compile(
    r"(?=[,;|.!?:\s])(?:[,;|\n]|\.(?!\d)|(?<=\s)!+|\?+|\s:\s|::|:\s*:|\s[-+]\s)"
)
_SPACE = re.compile(r"\s+")
_HYPHEN = re.compile(r"(?<=[^\W\d_])-(?=[^\W\d_])")


_DIGIT = re.compile(r"\d")
_DIGIT_RULES = (
    (re.compile(r"(?<=\d) (?=\d)"), ""),
    (re.compile(r"(?<=\d) (k|d|th|st|nd|rd|mm|px|yo|p|x)\b"), r"\1"),
    (re.compile(r"(?<=\d)\. (?=\d)"), "."),
)
_SPACED_SIGNS = (
    (" / ", re.compile(r"(?<=\w) / (?=\w)"), "/"),
    (" - ", re.compile(r"(?<=\w) - (?=\w)"), "-"),
    (" & ", re.compile(r"(?<=\b\w) & (?=\w\b)"), "&"),
)


def _join_spaced(text: str) -> str:
    """Undo the spaced digits and hyphens of scraped prompts ("1 7 th", "3 d", "head - on")."""
    if _DIGIT.search(text):
        for pattern, repl in _DIGIT_RULES:
            text = pattern.sub(repl, text)
    for sign, pattern, repl in _SPACED_SIGNS:
        if sign in text:  # a cheap test first: most prompts have none
            text = pattern.sub(repl, text)
    return text


def normalize(text: str) -> str:
    """NFKC, lower case, ASCII punctuation, joined spaced digits; keeps every word."""
    text = unicodedata.normalize("NFKC", text)
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = text.lower()
    weighted: list[str] = []

    def _protect(match: re.Match) -> str:
        weighted.append(f"({_SPACE.sub(' ', match.group(1).strip())}:{match.group(2)})")
        return f",\x01{len(weighted) - 1}\x01,"

    if ":" in text:
        text = _WEIGHTED.sub(_protect, text)
    text = text.translate(_PUNCT_MAP)
    text = " ".join(text.split())  # as _SPACE.sub(" ", text).strip(), a few times faster
    text = _join_spaced(text)
    for i, chunk in enumerate(weighted):
        text = text.replace(f"\x01{i}\x01", chunk)
    return text


def split_tags(text: str) -> list[str]:
    """Split normalised text into tags at commas, semicolons, sentence ends and ' : '."""
    return [t for t in (p.strip(" '-+:/&.") for p in _TAG_SPLIT.split(text)) if t]


def _alternation(phrases) -> str:
    ordered = sorted(set(phrases), key=lambda p: (-len(p), p))
    return "|".join(re.escape(p).replace(r"\ ", r"[\s-]+") for p in ordered)


_SITE_CANON = {s: s.replace("cg society", "cgsociety").split(" contest")[0] for s in ART_SITES}
_SITE_RE = re.compile(
    r"(?<![\w-])(?:(?:trending|featured|popular|top|as seen) (?:on|in) )?"
    rf"(?P<site>{_alternation(ART_SITES)})"
    r"(?: (?:hq|hd|trending|contest winner|winner))?(?![\w-])"
)
_BP_CLASS = {m: canon for canon, members in BOILERPLATE.items() for m in members}
_BP_RE = re.compile(
    rf"(?<![\w-])(?:{_alternation(m for m in _BP_CLASS if m not in TAG_ONLY)})(?![\w-])"
)
_BINOMIAL_RE = re.compile(
    rf"(?<![\w-])(?:{_alternation(BINOMIALS)})(?![\w-])".replace("the ", "(?:the )?")
)

_MEDIUM_END = re.compile(rf"\b(?:{_alternation(MEDIUM_NOUNS)})$")


def _style_of(match: re.Match) -> str:
    """ "in the style of X" -> "X style"; "X" alone when X is a medium ("watercolor painting")."""
    what = match["what"]
    return f"{match['pre']} {what}" if _MEDIUM_END.search(what) else f"{match['pre']} {what} style"


# Rewrites of a whole tag, applied in order: (pattern, replacement, words that must occur for
# the pattern to be tried at all; a cheap guard that keeps compression well under 1 ms).
_Rule = tuple[re.Pattern, str | Callable[[re.Match], str], frozenset[str]]
_PHRASE_RULES: tuple[_Rule, ...] = tuple(
    (re.compile(p), r, frozenset(t.split()))
    for p, r, t in (
        # meta instructions to the generator at the start of a tag
        (
            r"^(?:(?:please|kindly) )?(?:(?:can|could|would|will) you (?:please )?)?"
            r"(?:(?:i (?:want|need|would like|would love|wish for|am looking for)"
            r"|i'?d (?:like|love)) "
            r"(?:you to |to (?:see|get|have) )?)?(?:(?:please )?(?:generate|create|produce|"
            r"give me|show me|draw me|paint me|render me|make me|make) (?=(?:a|an|the|me|"
            r"some|one|this|my) ))?",
            "",
            "please kindly can could would will i i'd id generate create produce give show draw "
            "paint render make",
        ),
        (r"^(?:please )?(?:generate|create|produce) ", "", "generate create produce"),
        # "portrait showing a punk rocker" -> "portrait punk rocker"
        (
            rf"\b(?P<medium>{_alternation(MEDIUM_NOUNS)}) (?:showing|that shows|depicting) ",
            r"\g<medium> ",
            "showing shows depicting",
        ),
        (r"\bmake sure (?:that )?", "", "make"),
        (r"\bmake (?:it|this|the (?:image|picture|photo)) (?:look )?(?:like )?", "", "make"),
        (
            r"\b(?:it|this|(?:the )?(?P<medium>image|picture|photo)) should "
            r"(?:look like|be|have|feel|show|depict) ",
            r"\g<medium> ",
            "should",
        ),
        (r"\b(?:kind|sort) of\b", "", "kind sort"),
        (
            r"\b(?:about|around|approximately|roughly|maybe) (?=\d)",
            "",
            "about around approximately roughly maybe",
        ),
        # "boy of 8 years old", "who looks about 35 years old" ("about" is gone already)
        (r"\b(?:of|looks) (?=\d+ years? old\b)", "", "old"),
        # "looking directly at", "looking straight into" -> "looking at", "looking into"
        (
            r"\b(?P<verb>looking|looks|staring|stares|gazing|gazes) (?:directly|straight) "
            r"(?=(?:at|into)\b)",
            r"\g<verb> ",
            "directly straight",
        ),
        (r"\b(?:a )?pair of (?=\w)", "", "pair"),
        # "neon lights in the background" -> "neon lights background"
        # ("standing in the background" keeps its "in": there the subject is in it)
        (r"(?<=\w)(?<!ing) in (?:the )?background\b", " background", "background"),
        (r"\bclose[ -]up\b", "closeup", "close close-up"),  # one CLIP token instead of 2-3
        (r"^(?P<pre>.*?)\b(?:in )?(?:the )?style of (?P<what>.+)$", _style_of, "style"),
    )
)

_RULE_WORDS = frozenset().union(*(triggers for _, _, triggers in _PHRASE_RULES))


@dataclass
class Compression:
    """A compressed prompt and what happened to the words of the original."""

    text: str
    tags: list[str]
    removed: list[str] = field(default_factory=list)  # content words dropped (duplicates)
    canonicalised: list[tuple[str, str]] = field(default_factory=list)  # (original, canonical)


def _is_content(word: str) -> bool:
    return bool(re.search(r"\w", word)) and (word in NEGATIONS or word not in FUNCTION_WORDS)


class _Canon:
    """Tracks which boilerplate classes and tags a prompt has emitted already."""

    def __init__(self) -> None:
        self.emitted: set[str] = set()
        self.canonicalised: list[tuple[str, str]] = []
        self.removed: list[str] = []

    def mark(self, original: str, canon: str) -> str:
        """Placeholder for a boilerplate occurrence: canonical on first use, else empty."""
        original = _SPACE.sub(" ", original.replace("-", " ")).strip()
        key = "bp:" + canon
        if key in self.emitted:
            self.canonicalised.append((original, ""))
            return " "
        self.emitted.add(key)
        if canon.startswith("site:"):
            shown = canon.split(":", 1)[1]
        elif _clip_length(original) <= _clip_length(canon):
            shown = original  # "hd" stays "hd" (CLIP reads "8k" as two tokens): never add any
        else:
            shown = canon  # "ultra detailed" -> "detailed"
        if original != shown:
            self.canonicalised.append((original, shown))
        return " \x02" + shown.replace(" ", "\x03") + "\x02 "


@functools.lru_cache(maxsize=4096)
def _clip_length(phrase: str) -> int:
    """CLIP tokens of a boilerplate phrase (a member or a canonical form: a bounded set)."""

    return count_tokens(embedded_tokenizer(), phrase)


def _has_meaning(word: str) -> bool:
    """A word has a letter, digit, placeholder or pictograph (CLIP has emoji tokens)."""
    if word.isalnum():
        return True  # the common case, without a look at each character
    return any(ch.isalnum() or ch in "\x02&" or unicodedata.category(ch) == "So" for ch in word)


def _apply_phrase_rules(tag: str) -> str:
    """Apply :data:`_PHRASE_RULES` whose trigger words occur in the tag."""
    present = set(tag.split())
    if present.isdisjoint(_RULE_WORDS):
        return tag
    for pattern, repl, triggers in _PHRASE_RULES:
        if not triggers.isdisjoint(present):
            tag = pattern.sub(repl, tag).strip()
            present = set(tag.split())
    return tag


def _kept_words(tag: str, canon: _Canon) -> list[str]:
    """The words of a rewritten tag less function words and a word repeated at once."""
    words: list[str] = []
    raw = tag.split()
    for i, word in enumerate(raw):
        word = word.strip("'.:/+-")
        if not word or word in DROP_ALWAYS or not _has_meaning(word):
            continue
        if word == "of" and i > 0 and raw[i - 1] in MEDIUM_NOUNS:
            continue
        word = _render(word)
        if words and word == words[-1] and _is_content(word):
            canon.removed.append(word)  # "cute cute" -> "cute"
            continue
        words.append(word)
    return words


def _rewrite_tag(tag: str, canon: _Canon) -> list[str]:
    """Return the kept words of one tag (boilerplate already canonical)."""
    if tag.startswith("(") and tag.endswith(")"):
        return [tag]  # weighted emphasis, verbatim
    whole = _SPACE.sub(" ", tag.replace("-", " ")) if "-" in tag else tag
    if whole in _BP_CLASS:
        marked = canon.mark(whole, _BP_CLASS[whole]).strip()
        return [_render(marked)] if marked else []
    tag = _apply_phrase_rules(tag)
    tag = _SITE_RE.sub(lambda m: canon.mark(m.group(0), "site:" + _SITE_CANON[m["site"]]), tag)
    tag = _BP_RE.sub(lambda m: canon.mark(m.group(0), _BP_CLASS[_norm_bp(m.group(0))]), tag)
    if "-" in tag:
        tag = _HYPHEN.sub(" ", tag)  # "full-body" -> "full body": CLIP spends a token on "-"
    if "and" in tag:
        tag = _BINOMIAL_RE.sub(lambda m: m.group(0).replace(" ", "\x04"), tag)
    return _kept_words(tag, canon)


def _norm_bp(phrase: str) -> str:
    return _SPACE.sub(" ", phrase.replace("-", " ")).strip() if phrase not in _BP_CLASS else phrase


# hyphenated members are matched with [\s-]+; map both spellings to their class
for _member, _canon in list(_BP_CLASS.items()):
    _BP_CLASS.setdefault(_member.replace("-", " "), _canon)


def _render(word: str) -> str:
    """The shown form of a canonical boilerplate or binomial placeholder word."""
    if word[0] == "\x02":
        return word.strip("\x02").replace("\x03", " ")
    return word.replace("\x04", " ") if "\x04" in word else word


_CANON_WORDS = frozenset(w for phrase in _BP_CLASS for w in phrase.split())  # any shown form


def _drop_subsumed(tags: list[list[str]], canon: _Canon) -> list[list[str]]:
    """Drop a one-word tag that another tag already holds ("fantasy" next to "fantasy art"),
    and "art" of "art by X" when the prompt says "art" elsewhere."""
    texts = [" " + " ".join(t) + " " for t in tags]
    kept: list[list[str]] = []
    for i, tag in enumerate(tags):
        phrase = texts[i]
        holders = (  # a longer tag may carry its own emphasis: only one-word tags go
            [j for j, other in enumerate(texts) if j != i and phrase in other]
            if len(tag) == 1
            else []
        )
        if (
            holders
            and not set(phrase.split()) & _CANON_WORDS
            and any(j < i or texts[j] != phrase for j in holders)
        ):
            canon.removed.extend(w for w in tag if _is_content(w))
            texts[i] = " \x00 "  # a removed tag holds nothing
            continue
        kept.append(tag)
    art_elsewhere = sum(" art " in t for t in texts) > 1
    if art_elsewhere:
        for n, tag in enumerate(kept):
            if len(tag) > 2 and tag[0] == "art" and tag[1] == "by":
                kept[n] = tag[1:]
                canon.removed.append("art")
                break
    return kept


# An identity noun right before one of these qualifies a part or a framing of the subject
# ("fashion model face", "female portrait"): such a tag is not moved first.
SUBJECT_PARTS = frozenset({"face", "faces", "portrait", "head", "headshot", "body", "figure"})


def _mentions_identity(tag: list[str]) -> bool:
    return not IDENTITY_NOUNS.isdisjoint(" ".join(tag).split())


def _names_subject(tag: list[str]) -> bool:
    """The tag has an identity noun that is not a modifier of a part ("model face")."""
    words = " ".join(tag).split()
    return not IDENTITY_NOUNS.isdisjoint(words) and any(
        w in IDENTITY_NOUNS and (i + 1 == len(words) or words[i + 1] not in SUBJECT_PARTS)
        for i, w in enumerate(words)
    )


def _identity_first(tags: list[list[str]]) -> list[list[str]]:
    """Move the first short tag that names the subject to the front, unless the first
    mentions it already."""
    if not tags or _mentions_identity(tags[0]):
        return tags
    for i, tag in enumerate(tags):
        if len(tag) <= IDENTITY_TAG_MAX_WORDS and _names_subject(tag):
            return [tag, *tags[:i], *tags[i + 1 :]]
    return tags


def compress(
    text: str,
    *,
    separator: str = "compact",
    identity_first: bool = True,
    normalized: bool = False,
    apart: frozenset[str] | set[str] = frozenset(),
) -> Compression:
    """Compress a prompt; see the module docstring for the steps. Never raises on str input.

    ``normalized=True`` skips :func:`normalize` for text that has been through it already.
    ``apart``: tags (as in the normalised text) that are attributes ("smiling", "glasses",
    "soft studio light"): the compact join puts a comma on both sides of each, so that
    attributes never run together into new phrases ("smiling hair soft studio light").
    """
    if separator not in SEPARATORS:
        raise ValueError(f"separator must be one of {SEPARATORS}, got {separator!r}")
    canon = _Canon()
    tags: list[list[str]] = []
    seen: set[str] = set()
    kept_apart: set[str] = set()
    for raw in split_tags(text if normalized else normalize(text)):
        words = _rewrite_tag(raw, canon)
        if not words:
            continue
        key = " ".join(words)
        if raw in apart:
            kept_apart.add(key)
        if key in seen:
            canon.removed.extend(w for w in words if _is_content(w))
            continue
        seen.add(key)
        tags.append(words)
    tags = _drop_subsumed(tags, canon)
    if identity_first:
        tags = _identity_first(tags)
    phrases = [" ".join(t) for t in tags]
    return Compression(
        text=join_tags(tags, separator, apart=kept_apart),
        tags=phrases,
        removed=canon.removed,
        canonicalised=canon.canonicalised,
    )


_ADJECTIVAL = re.compile(r"(?:ed|ic|al|ous|ful|ive|ing|ant|ent|less|ish|ible|able|ese|ian|ly|est)$")


def _fixed_phrase(tag: list[str]) -> bool:
    """A tag that is one canonical boilerplate or binomial ("best quality", "black and white"):
    a fixed expression that no neighbour blurs, so it never needs a comma."""
    return len(tag) == 1 and " " in tag[0]


def _noun_like(tag: list[str]) -> bool:
    return (
        len(tag) == 1
        and not _fixed_phrase(tag)
        and not _ADJECTIVAL.search(tag[0])
        and tag[0][:1].isalpha()
    )


LIST_LIKE_WORDS_PER_TAG = 1.9  # a prompt of shorter tags on average is a list of items


def _nounish(tag: list[str]) -> bool:
    return not _fixed_phrase(tag) and (len(tag) > 1 or not _ADJECTIVAL.search(tag[0]))


def join_tags(
    tags: list[list[str]], separator: str = "compact", *, apart: set[str] | frozenset = frozenset()
) -> str:
    """Join tags.

    "compact" joins with a space, since a comma is one CLIP token per tag. It keeps a comma
    where two one-word noun tags meet ("fire, mask" must not read as a "fire mask"), where two
    numbers would merge ("iso 100, 35mm"), and, in list-like prompts (short tags, on average
    at most :data:`LIST_LIKE_WORDS_PER_TAG` words), between any two noun tags of one or two
    words ("real estate, blender"), where merging would blur the items most. A fixed phrase
    (one canonical boilerplate or binomial, "best quality") needs no comma on either side.
    A tag in ``apart`` (an attribute of an instruction) has a comma on both sides.
    """
    if separator != "compact":
        return separator.join(" ".join(t) for t in tags)
    list_like = sum(len(t) for t in tags) <= LIST_LIKE_WORDS_PER_TAG * len(tags)
    nouns = [_noun_like(t) for t in tags]  # each tag tested once, not once per neighbour
    nounish = [_nounish(t) for t in tags]
    out: list[str] = []
    for i, tag in enumerate(tags):
        if i:
            prev = tags[i - 1]
            comma = (
                (" ".join(prev) in apart or " ".join(tag) in apart)
                or (prev[-1][-1:].isdigit() and tag[0][:1].isdigit())
                or (nouns[i - 1] and nouns[i])
                or (
                    list_like and len(prev) <= 2 and len(tag) <= 2 and nounish[i - 1] and nounish[i]
                )
            )
            out.append(", " if comma else " ")
        out.append(" ".join(tag))
    return "".join(out)
