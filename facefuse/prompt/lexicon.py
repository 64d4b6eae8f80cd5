"""Word lists and phrase tables of the prompt engine, in one place.

Everything here is data: the compressor (:mod:`facefuse.prompt.compress`), the instruction
parser (:mod:`facefuse.prompt.structured`) and the evaluation (:mod:`facefuse.prompt.evaluate`)
read the same tables, so "what counts as a content word" and "what the compressor may drop"
cannot drift apart.
"""

from __future__ import annotations

# Function words: articles, pronouns, auxiliaries, conjunctions, prepositions and determiners
# (the NLTK English list without its negations, which carry meaning in a prompt). The evaluation
# does not count these as content words; the compressor drops only the subset in DROP_ALWAYS
# and a few more in context.
FUNCTION_WORDS = frozenset(
    """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his himself
    she her hers herself it its itself they them their theirs themselves what which who whom
    this that these those am is are was were be been being have has had having do does did
    doing a an the and but if or because as until while of at by for with about against between
    into through during before after above below to from up down in out on off over under again
    further then once here there when where why how all any both each few more most other some
    such only own same so than too very s t can will just don should now d ll m o re ve y
    ain would could might must shall may also whose
    """.split()
)

# Negations are never dropped and always count as content.
NEGATIONS = frozenset({"no", "not", "nor", "without", "never", "none", "neither"})

# Words that carry no meaning in an image prompt wherever they stand.
DROP_ALWAYS = frozenset(
    {
        "a",
        "an",
        "the",
        "very",
        "really",
        "quite",
        "so",
        "just",
        "also",
        "please",
        "kindly",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "am",
        "has",
        "have",
        "had",
        "having",
        "who",
        "whom",
        "which",
        "that",
        "there",
        "it",
        "its",
        "she",
        "he",
        "they",
        "her",
        "his",
        "their",
        "i",
        "me",
        "my",
        "we",
        "our",
        "you",
        "your",
        "him",
        "them",
        "with",
        "should",
        "would",
        "could",
        "must",
        "can",
        "will",
        "shall",
        "might",
        "may",
        "he's",
        "she's",
        "it's",
        "they're",
        "i'm",
        "we're",
        "you're",
        "there's",
        "that's",
        "and",
    }
)

# "and" is dropped ("red and blue" -> "red blue"), except inside these fixed expressions.
BINOMIALS = (
    "black and white",
    "salt and pepper",
    "dungeons and dragons",
    "rock and roll",
    "beauty and the beast",
    "pride and prejudice",
    "sword and sorcery",
    "d and d",
    "pen and ink",
    "ink and wash",
    "hide and seek",
    "light and shadow",
    "life and death",
    "good and evil",
    "yin and yang",
    "stars and stripes",
    "bread and butter",
    "sun and moon",
    "day and night",
    "fire and ice",
    "blood and bone",
)

# Prompt meta-words: instructions to the generator, not descriptions of the image. They are not
# counted as content words by the evaluation (listed here so the choice is visible and small).
META_WORDS = frozenset(
    {
        "please",
        "generate",
        "create",
        "want",
        "like",
        "need",
        "ensure",
        "sure",
        "let",
        "lets",
        "image",
        "picture",
    }
)

# "portrait of X" -> "portrait X": "of" after these medium nouns carries no meaning.
MEDIUM_NOUNS = frozenset(
    {
        "portrait",
        "portraits",
        "photo",
        "photos",
        "photograph",
        "photographs",
        "picture",
        "pictures",
        "image",
        "images",
        "painting",
        "paintings",
        "drawing",
        "drawings",
        "illustration",
        "illustrations",
        "sketch",
        "render",
        "rendering",
        "closeup",
        "close-up",
        "headshot",
        "headshots",
        "bust",
        "shot",
        "selfie",
        "snapshot",
        "still",
        "poster",
        "depiction",
        "study",
        "photography",
        "caricature",
        "statue",
        "sculpture",
        "artwork",
    }
)

# Identity nouns: a tag that names the subject goes first.
IDENTITY_NOUNS = frozenset(
    {
        "man",
        "men",
        "woman",
        "women",
        "girl",
        "girls",
        "boy",
        "boys",
        "lady",
        "ladies",
        "guy",
        "person",
        "people",
        "child",
        "kid",
        "teenager",
        "teen",
        "female",
        "male",
        "gentleman",
        "baby",
        "toddler",
        "father",
        "mother",
        "grandmother",
        "grandfather",
        "grandma",
        "grandpa",
        "businessman",
        "businesswoman",
        "bride",
        "groom",
        "couple",
        "dad",
        "mom",
        "husband",
        "wife",
        "son",
        "daughter",
        "actor",
        "actress",
        "model",
        "elder",
        "senior",
        "adult",
        "youth",
    }
)

# Boilerplate classes: every member means the same quality cue; the first occurrence in a prompt
# is shown in the class's canonical form (the key) when that has fewer CLIP tokens, else as the
# user wrote it ("high quality" stays: "best quality" is no shorter), later ones are dropped.
# Multi-word members match anywhere in a tag; members in TAG_ONLY match only a whole tag (e.g.
# "sharp" in "sharp teeth" is content).
BOILERPLATE: dict[str, tuple[str, ...]] = {
    "detailed": (
        "highly detailed",
        "highly-detailed",
        "ultra detailed",
        "ultra-detailed",
        "extremely detailed",
        "hyper detailed",
        "hyper-detailed",
        "hyperdetailed",
        "very detailed",
        "super detailed",
        "insanely detailed",
        "intricately detailed",
        "incredibly detailed",
        "high detail",
        "high details",
        "high detailed",
        "intricate details",
        "intricate detail",
        "fine details",
        "fine detail",
        "ultra detail",
        "extreme detail",
        "extremely high detail",
        "lots of details",
        "lots of detail",
        "hyper detail",
        "ultra high detail",
        "very high detail",
        "super detail",
        "maximum detail",
        "highly intricate details",
        "detailed",
    ),
    "8k": (
        "8k",
        "4k",
        "16k",
        "32k",
        "2k",
        "hd",
        "uhd",
        "full hd",
        "fullhd",
        "ultra hd",
        "8k uhd",
        "4k uhd",
        "8k resolution",
        "4k resolution",
        "high resolution",
        "high-resolution",
        "hi-res",
        "hires",
        "highres",
        "high res",
        "1080p",
        "ultra high resolution",
        "very high resolution",
        "8k hd",
        "4k hd",
        "uhd 8k",
    ),
    "best quality": (
        "best quality",
        "high quality",
        "highest quality",
        "top quality",
        "hq",
        "high-quality",
        "ultra quality",
        "great quality",
        "amazing quality",
        "very high quality",
        "extremely high quality",
        "excellent quality",
        "ultra high quality",
        "high-q",
    ),
    "masterpiece": ("masterpiece", "masterwork"),
    "sharp focus": (
        "sharp focus",
        "in focus",
        "crisp focus",
        "super sharp",
        "razor sharp",
        "tack sharp",
        "sharp details",
        "very sharp",
        "ultra sharp",
        "extremely sharp",
        "sharp image",
        "sharp",
        "crisp",
        "focused",
    ),
    "hyperrealistic": (
        "hyperrealistic",
        "hyper realistic",
        "hyper-realistic",
        "hyperrealism",
        "hyper realism",
        "ultra realistic",
        "ultra-realistic",
        "ultrarealistic",
        "ultra realism",
        "super realistic",
        "extremely realistic",
        "insanely realistic",
        "hyper-realism",
        "hyper photorealistic",
    ),
    "photorealistic": (
        "photorealistic",
        "photo realistic",
        "photo-realistic",
        "photorealism",
        "photo realism",
        "ultra photorealistic",
        "ultra photoreal",
        "photoreal",
    ),
    "octane render": (
        "octane render",
        "octane renderer",
        "rendered in octane",
        "octane",
        "octanerender",
        "render octane",
    ),
    "unreal engine": (
        "unreal engine",
        "unreal engine 5",
        "unreal engine 4",
        "unreal 5",
        "unreal 4",
        "ue5",
        "ue4",
        "rendered in unreal engine",
        "unreal engine render",
        "unreal",
    ),
    "award winning": ("award winning", "award-winning", "award winner"),
}
TAG_ONLY = frozenset({"detailed", "sharp", "crisp", "focused", "unreal", "octane", "hd"})

# Art sites: "trending on X", "featured on X", "X trending", "X hq" all mean "X".
ART_SITES = (
    "artstation",
    "cgsociety",
    "cg society",
    "pixiv",
    "deviantart",
    "behance",
    "instagram",
    "pinterest",
    "unsplash",
    "500px",
    "flickr",
    "tumblr",
    "reddit",
    "zbrush central",
    "polycount",
    "dribbble",
    "imgur",
    "furaffinity",
    "pixiv fanbox",
    "cgsociety contest winner",
)

# --- Instruction understanding (:mod:`facefuse.prompt.understand`) ---------------------------
#
# Canonical values of the face edit, in the words the text tower was trained on and the
# expression editor consumes. ``expression`` is one of EXPRESSIONS; a smile asked for together
# with an open mouth keeps its smile value and adds ``mouth: "open"``; an open mouth alone is
# ``expression: "open mouth"``.
SLIGHT_SMILE, SMILING, BIG_SMILE = "slight smile", "smiling", "big smile"
NEUTRAL, OPEN_MOUTH = "neutral expression", "open mouth"
EXPRESSIONS = (SLIGHT_SMILE, SMILING, BIG_SMILE, NEUTRAL, OPEN_MOUTH)
SMILES = (SLIGHT_SMILE, SMILING, BIG_SMILE)  # weakest first

# English entries: phrase (space-separated words) -> (kind, value). Kinds: "smile" (a smile
# word with its base strength), "neutral", "mod" (smile strength: slight, big or plain), "neg"
# (flips what follows: negators and removal verbs), "keep" (verbs that keep or add), "item"
# (a present/absent item, value = attribute key), "style", "filler" (says nothing by itself).
EN_SMILE_WORDS = {
    **dict.fromkeys(("smile", "smiles", "smiling", "smiled", "smiley", "grin", "grins"), SMILING),
    **dict.fromkeys(("grinning", "grinned", "happy", "happier", "happily", "cheerful"), SMILING),
    **dict.fromkeys(("joyful", "joyous", "glad", "merry", "cheery", "cheer up"), SMILING),
    **dict.fromkeys(("laugh", "laughs", "laughing", "laughed", "beam", "beams"), BIG_SMILE),
    **dict.fromkeys(("beaming", "beamed", "laughter", "chuckle", "chuckling"), BIG_SMILE),
    **dict.fromkeys(("giggle", "giggles", "giggling", "delighted", "overjoyed"), BIG_SMILE),
    **dict.fromkeys(("ecstatic", "thrilled", "crack up", "cracking up"), BIG_SMILE),
    **dict.fromkeys(("pleased", "amused", "frown upside down"), SMILING),
    **dict.fromkeys(("smirk", "smirks", "smirking", "half-smile"), SLIGHT_SMILE),
}
EN_NEUTRAL_WORDS = (
    "neutral", "serious", "seriously", "expressionless", "straight face", "poker face",
    "blank expression", "blank face", "blank look", "calm face", "calm expression", "calm",
    "stern", "deadpan", "solemn", "unsmiling", "no expression", "impassive", "stoic",
    "emotionless", "relaxed face", "relaxed expression", "resting face", "expression blank",
    "face blank", "expressionless face", "neutral look", "serious look", "sober",
)  # fmt: skip
EN_SMILE_MODS = {
    **dict.fromkeys(
        ("slight", "slightly", "small", "little", "subtle", "subtly", "faint", "faintly"), "slight"
    ),
    **dict.fromkeys(
        ("gentle", "gently", "soft", "softly", "hint", "tiny", "half", "mild", "mildly"), "slight"
    ),
    **dict.fromkeys(("barely", "bit", "touch", "shy", "shyly", "closed-mouth", "tight"), "slight"),
    **dict.fromkeys(("modest", "closed-lip", "closed-lipped", "tight-lipped", "less"), "slight"),
    **dict.fromkeys(("closed mouth", "closed lips", "subtler", "smaller", "softer"), "slight"),
    **dict.fromkeys(("tone down", "dial down", "soften", "reduce", "smaller one"), "slight"),
    **dict.fromkeys(("teeth", "with teeth", "showing teeth", "open-mouthed"), "big"),
    **dict.fromkeys(("big", "bigger", "biggest", "broad", "broadly", "wide", "widely"), "big"),
    **dict.fromkeys(("wider", "huge", "large", "toothy", "giant", "enormous", "massive"), "big"),
    **dict.fromkeys(("more", "ear to ear", "full", "radiant", "hearty"), "big"),
    **dict.fromkeys(
        ("warm", "warmly", "friendly", "nice", "pleasant", "genuine", "natural"), "plain"
    ),
    **dict.fromkeys(("sweet", "kind", "polite", "bright", "real", "lovely"), "plain"),
}
EN_NEGATORS = (
    "no", "not", "don't", "dont", "do not", "never", "stop", "stops", "stopped", "quit",
    "without", "no longer", "no more", "shouldn't", "should not", "mustn't", "must not",
    "can't", "cannot", "isn't", "aren't", "won't", "doesn't", "does not", "didn't", "cease",
    "avoid", "nor", "neither", "remove", "removes", "removed", "removing", "take off",
    "take away", "take out", "taken off", "delete", "drop", "lose", "get rid of", "wipe",
    "wipe off", "erase", "strip", "minus", "shave", "shave off", "eliminate", "ditch",
)  # fmt: skip
EN_KEEPERS = (
    "keep", "keeps", "kept", "keeping", "retain", "preserve", "maintain", "leave", "add", "adds",
    "with", "wear", "wears", "wearing", "put on", "give", "gives", "has", "have", "show", "still",
)  # fmt: skip
# item words -> attribute key (a synonym maps to one key)
EN_ITEMS = {
    **{w: w for w in ("glasses", "sunglasses", "beard", "hat", "cap", "necklace", "makeup")},
    **{w: w for w in ("lipstick", "freckles", "tattoo", "scarf", "headphones", "mask", "veil")},
    **{w: w for w in ("piercing", "crown", "tie", "bangs", "wrinkles", "scar", "helmet", "hood")},
    **{w: w for w in ("headband", "bow tie", "goatee", "mustache", "earrings", "hair")},
    **{w + "s": w for w in ("hat", "cap", "necklace", "mask", "veil", "piercing", "crown")},
    **{w + "s": w for w in ("tie", "scar", "helmet", "hood", "headband", "goatee", "mustache")},
    "hairstyle": "hair",
    "haircut": "hair",
    "hairdo": "hair",
    "eyeglasses": "glasses",
    "spectacles": "glasses",
    "specs": "glasses",
    "shades": "sunglasses",
    "moustache": "mustache",
    "earring": "earrings",
    "tattoos": "tattoo",
    "make-up": "makeup",
}
# items named absent ("clean-shaven" = no beard)
EN_ITEMS_ABSENT = {
    "clean-shaven": "beard", "clean shaven": "beard", "beardless": "beard", "shaven": "beard",
    "bare-faced": "makeup", "makeup-free": "makeup", "bareheaded": "hat",
}  # fmt: skip
EN_STYLES = {
    **dict.fromkeys(("black and white", "black-and-white", "b&w", "b/w", "monochrome"), "bw"),
    **dict.fromkeys(("grayscale", "greyscale", "black and white photo", "monochrome photo"), "bw"),
    **dict.fromkeys(("black and white portrait", "black and white picture"), "bw"),
    **dict.fromkeys(("black & white", "black&white", "b & w", "bw"), "bw"),
}
BLACK_AND_WHITE = "black and white"
# Words an instruction uses around what it asks for ("could you please make her ... a bit").
EN_FILLERS = frozenset(
    """
    please pls plz kindly make makes making let lets look looks looking appear appears seem face
    wait hmm fine instead take scratch that one second thought
    faces expression expressions actually instead again now rather really try just also then
    everyone everybody could would you want wants like i person subject ok okay sure be being
    become turn get going go thanks thank can should will set put on off up out lot much very
    visible photo picture image edit change changes mood bit little
    """.split()
) | frozenset(w for w in FUNCTION_WORDS if w not in NEGATIONS)
# Eyes and mouth states are phrases with a gap ("close her eyes"): regexes, tried before the
# word scan; the placeholder word they leave is read like any other lexicon word.
_OPEN = r"(?:open|opens|opened|opening)"
_CLOSE = r"(?:close|closes|closed|closing|shut|shuts|shutting)"
_POSS = r"(?:(?:her|his|their|the|its|your|both|my|our|them|him|both of (?:her|his|their)) )?"
# words that may stand between a part and its state ("eyes should be open", "mouth wide open")
_GAP = (
    r"(?:(?:should|must|to|be|is|are|stay|stays|remain|remains|kept|wide|slightly|half|"
    r"tightly|gently|fully|bit|little|a|still|now|partly|partially|softly|not|never|"
    r"shouldn't|mustn't|isn't|aren't) ){0,4}"
)
EN_STATE_PATTERNS = (
    (rf"\b{_CLOSE} {_POSS}(?:(?:eyes?|eyelids?)\b)", "eyes_closed"),
    (rf"\b(?:eyes?|eyelids?) {_GAP}(?:closed|shut)\b", "eyes_closed"),
    (rf"\b{_OPEN} {_POSS}(?:wide |big )?eyes?\b", "eyes_open"),
    (rf"\beyes? {_GAP}open(?:ed)?\b|\bwide[- ]eyed\b", "eyes_open"),
    (r"\bblink(?:s|ing)?\b", "eyes_closed"),
    # "close her eyes, then open them again": the part named before
    (r"\b(?:open|opens|opened) (?:them|it)\b", "ref_open"),
    (r"\b(?:close|closes|closed|shut) (?:them|it)\b", "ref_closed"),
    (rf"\b{_CLOSE} {_POSS}(?:mouth|lips)\b", "mouth_closed"),
    (rf"\b(?:mouth|lips) {_GAP}(?:closed|shut|together)\b", "mouth_closed"),
    (rf"\b{_OPEN} {_POSS}(?:wide )?mouth\b|\blips (?:\w+ )?parted\b|\bparted lips\b", "mouth_open"),
    (r"\bopen[- ]mouthed\b", "mouth_open"),
    (rf"\bmouth {_GAP}(?:open(?:ed)?|agape)\b|\bjaw dropped\b", "mouth_open"),
)
# age words read anywhere in a clause ("younger and happier")
EN_AGE = {"older": "older", "younger": "younger", "elderly": "older", "aged": "older"}
# after a target, these remove it ("the glasses have to go", "the smile must go")
EN_POST_NEGATORS = (
    "has to go", "have to go", "must go", "should go", "needs to go", "need to go", "gotta go",
    "can go", "goes", "taken away", "taken off", "wiped off",
)  # fmt: skip
# item references ("remove the glasses, actually keep them"): the last item named before
EN_REFERENCES = ("them", "it", "those", "these", "that")

# Chinese entries, matched as substrings, longest first (forward maximum matching).
ZH_SMILE_WORDS = {
    **dict.fromkeys(
        ("微笑", "笑容", "笑脸", "笑", "一笑", "笑一笑", "笑一个", "开心", "高兴"), SMILING
    ),
    **dict.fromkeys(
        ("快乐", "愉快", "喜悦", "欢快", "笑眯眯", "笑嘻嘻", "乐呵呵", "笑着"), SMILING
    ),
    **dict.fromkeys(
        ("浅笑", "淡笑", "微微一笑", "微微笑", "抿嘴笑", "抿嘴一笑", "含笑"), SLIGHT_SMILE
    ),
    **dict.fromkeys(
        ("嘴角上扬", "嘴角微微上扬", "嘴角微扬", "嘴角上翘", "莞尔", "浅浅一笑"), SLIGHT_SMILE
    ),
    **dict.fromkeys(("笑意", "淡淡一笑", "一丝笑容", "一丝微笑"), SLIGHT_SMILE),
    **dict.fromkeys(
        ("大笑", "开怀大笑", "哈哈大笑", "咧嘴笑", "咧嘴", "露齿笑", "露齿而笑"), BIG_SMILE
    ),
    **dict.fromkeys(("欢笑", "狂笑", "爽朗地笑", "捧腹大笑", "笑开怀", "笑哈哈"), BIG_SMILE),
    **dict.fromkeys(
        ("笑出声", "笑出声来", "笑得合不拢嘴", "乐开了花", "乐开花", "笑弯了腰"), BIG_SMILE
    ),
    **dict.fromkeys(("乐一乐", "乐呵", "乐呵呵", "逗乐", "偷笑"), SMILING),
}
ZH_NEUTRAL_WORDS = (
    "中性表情", "中性的表情", "中性", "面无表情", "无表情", "没有表情", "不带表情", "严肃",
    "平静", "冷静", "淡定", "正经", "一本正经", "扑克脸", "冷漠", "不苟言笑", "自然表情",
    "平淡", "木讷", "表情中性", "板着脸", "绷着脸", "冷着脸", "表情收一收", "收敛表情",
    "收起表情", "表情收敛", "放松", "表情自然", "自然放松", "表情放松", "冷淡", "淡漠", "漠然",
)  # fmt: skip
# "表情" (expression) is a filler, except negated: "不要有任何表情", "没表情" -> neutral
ZH_EXPRESSION_NOUNS = ("表情", "任何表情", "神情")
ZH_SMILE_MODS = {
    **dict.fromkeys(
        ("微微", "稍微", "轻轻", "淡淡", "浅浅", "一点点", "略微", "些许", "轻微"), "slight"
    ),
    **dict.fromkeys(("稍稍", "有点", "含蓄", "腼腆", "羞涩"), "slight"),
    **dict.fromkeys(("大大", "灿烂", "开怀", "哈哈", "露齿", "爽朗", "大声", "使劲"), "big"),
    **dict.fromkeys(("夸张", "露出牙齿", "露牙", "露出牙", "很大", "用力", "尽情"), "big"),
    **dict.fromkeys(("合不拢嘴", "出声", "放声", "咧开嘴", "咧开", "咧着嘴", "张嘴"), "big"),
    **dict.fromkeys(("大一点", "大一些", "更大", "大点", "再大"), "big"),
    **dict.fromkeys(("眯起来", "眯成", "眯眼", "眯起眼", "眯着眼"), "big"),
    **dict.fromkeys(("满面", "满脸", "洋溢"), "big"),
    **dict.fromkeys(("甜甜", "甜美", "友好", "亲切"), "plain"),
}
ZH_NEGATORS = (
    "不", "别", "不要", "没有", "没", "不用", "无需", "勿", "停止", "收起", "不再", "别再",
    "去掉", "去除", "摘掉", "摘下", "摘了", "取下", "拿掉", "删掉", "删除", "移除", "除去",
    "剃掉", "刮掉", "去了", "取消", "不戴", "别戴", "不需要", "无", "摘", "剃", "刮", "删",
    "收一收", "收敛", "收住", "收起来", "拿下", "拿下来", "摘下来", "取下来", "拿走",
)  # fmt: skip
ZH_KEEPERS = (
    "别动", "不要动", "不动", "别碰", "不要碰", "保持不变", "不要改", "别改", "不用改",
    "保留", "保持", "留着", "留下", "维持", "不变", "戴", "戴上", "戴着", "加", "加上", "添加",
    "带上", "配上", "有", "穿", "留",
)  # fmt: skip
ZH_ITEMS = {
    "眼镜": "glasses", "墨镜": "sunglasses", "太阳镜": "sunglasses", "太阳眼镜": "sunglasses",
    "胡子": "beard", "胡须": "beard", "络腮胡": "beard", "小胡子": "mustache", "八字胡": "mustache",
    "帽子": "hat", "耳环": "earrings", "耳钉": "earrings", "项链": "necklace", "口罩": "mask",
    "面具": "mask", "妆": "makeup", "化妆": "makeup", "妆容": "makeup", "口红": "lipstick",
    "雀斑": "freckles", "纹身": "tattoo", "围巾": "scarf", "耳机": "headphones", "刘海": "bangs",
    "皱纹": "wrinkles", "头发": "hair", "发型": "hair", "领带": "tie", "头巾": "headband",
}  # fmt: skip
ZH_HAIR = {"短发": "short", "长发": "long", "金发": "blond", "黑发": "black", "红发": "red"}
ZH_EYES = {
    **dict.fromkeys(("闭眼", "闭上眼睛", "闭上眼", "闭着眼睛", "闭着眼", "眼睛闭上"), "closed"),
    **dict.fromkeys(("眼睛闭着", "闭目", "合上眼睛", "闭起眼睛", "闭起眼"), "closed"),
    **dict.fromkeys(("睁眼", "睁开眼睛", "睁开眼", "睁着眼睛", "睁着眼", "眼睛睁开"), "open"),
    **dict.fromkeys(("眼睛睁着", "睁大眼睛", "睁大眼", "眼睛睁大"), "open"),
}
ZH_MOUTH = {
    **dict.fromkeys(
        ("张嘴", "张开嘴", "张开嘴巴", "张着嘴", "张着嘴巴", "张大嘴", "张大嘴巴"), "open"
    ),
    **dict.fromkeys(("嘴巴张开", "嘴张开", "嘴巴张着", "嘴张着", "开口", "张口"), "open"),
    **dict.fromkeys(
        ("闭嘴", "闭上嘴", "闭上嘴巴", "闭着嘴", "闭着嘴巴", "嘴巴闭上", "合上嘴"), "closed"
    ),
    **dict.fromkeys(("嘴巴闭着", "嘴闭上", "抿着嘴", "合着嘴"), "closed"),
}
# Eyes and mouth as part + state in either order ("眼睛闭起来", "嘴巴微微张开"); the compound
# words of ZH_EYES / ZH_MOUTH are read first (longest match).
ZH_PARTS = {
    "眼睛": "eyes",
    "双眼": "eyes",
    "眼": "eyes",
    "嘴巴": "mouth",
    "嘴": "mouth",
    "嘴唇": "mouth",
}
ZH_PART_STATES = {
    **dict.fromkeys(
        ("闭", "闭上", "闭起来", "闭着", "闭起", "合上", "合起来", "合拢", "闭紧"), "closed"
    ),
    **dict.fromkeys(("睁", "睁开", "睁着", "睁大", "张", "张开", "张着", "张大", "打开"), "open"),
}
ZH_LIGHT = {"柔光": "soft", "暖光": "warm", "冷光": "cool", "自然光": "natural", "逆光": "back"}
ZH_LIGHT_MODS = {
    "柔和": "soft", "柔": "soft", "柔美": "soft", "影棚": "studio", "摄影棚": "studio",
    "棚拍": "studio", "工作室": "studio", "自然": "natural", "暖": "warm", "温暖": "warm",
    "暖色": "warm", "暖黄": "warm", "冷": "cool", "冷色": "cool", "戏剧": "dramatic",
    "戏剧性": "dramatic", "戏剧化": "dramatic", "电影": "cinematic", "电影感": "cinematic",
    "明亮": "bright", "昏暗": "dim", "侧": "side", "侧面": "side",
}  # fmt: skip
ZH_LIGHT_NOUNS = ("灯光", "光线", "光照", "照明", "打光", "光")
ZH_STYLES = {"黑白照片": "bw", "黑白照": "bw", "黑白": "bw", "单色": "bw", "黑白色": "bw"}
ZH_COLOURS = {
    "白色": "white", "白": "white", "黑色": "black", "灰色": "grey", "蓝色": "blue",
    "红色": "red", "绿色": "green", "黄色": "yellow", "粉色": "pink", "紫色": "purple",
}  # fmt: skip
ZH_BACKGROUND = ("背景", "底色", "白底")
ZH_AGE = {
    **dict.fromkeys(("变老", "老一点", "更老", "显老", "老一些", "苍老"), "older"),
    **dict.fromkeys(("变年轻", "年轻", "年轻一点", "显年轻", "更年轻"), "younger"),
}
ZH_FILLERS = (
    "让", "请", "把", "使", "给", "帮", "帮我", "我", "他", "她", "他们", "她们", "它", "你", "的",
    "地", "得", "了", "吧", "呢", "啊", "呀", "嘛", "哦", "一下", "一点", "一些", "一个", "一",
    "个", "下", "很", "非常", "更", "再", "都", "也", "就", "要", "想", "看起来", "看上去", "显得",
    "变得", "变成", "成", "换成", "改成", "改为", "将", "脸", "脸上", "面部", "表情", "露出",
    "带着", "面带", "并", "和", "与", "及", "跟", "还有", "照片", "图片", "画面", "先", "算了",
    "然后", "着", "这个", "那个", "人", "一点儿", "点", "些", "一样", "还是", "样子", "能",
    "可以", "麻烦", "谢谢", "出来", "起来", "好", "上", "整体",
    "所有人", "大家", "这张", "图", "模样", "弄", "做", "稍", "吗", "不对", "不行", "用", "拍",
    "哦不",
    "做成", "效果", "风格", "感觉", "一副", "副", "原来", "原本", "里", "里面", "照片里",
    "图里", "图中", "中", "那", "这", "是", "被", "其", "之", "会", "应该", "需要", "记得",
    "其实", "任何", "哦", "嗯", "那就", "改",
)  # fmt: skip
# Chinese words that join two requests in one clause ("保持中性表情并保留眼镜").
ZH_CLAUSE_JOINERS = (
    "然后", "并且", "同时", "而且", "但是", "接着", "之后", "再把", "并(?![不非没])", "不过",
    "可是", "但(?!是)", "另外", "此外", "还要", "顺便",
)  # fmt: skip

# Function words of other languages written in Latin letters: an instruction of which nothing
# was understood and that has some of these (and few English words) reads as another language.
FOREIGN_FUNCTION_WORDS = frozenset(
    """
    le la les des du un une est et il elle vous nous s'il sil plait plaît avec sans pas très
    el los las por favor que con sin una uno muy sonrie sonríe y es de del al lo
    der die das und mit nicht bitte ein eine ist ohne sehr ich du er sie wir ihr
    il lo gli di che per favore con senza non uno molto sorridi
    o os as um uma não sem com muito sorria você
    """.split()
)
