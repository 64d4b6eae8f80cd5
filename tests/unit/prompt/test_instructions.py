"""Instructions understood (issue 30): paraphrases, negations, Chinese, contradictions, unknown
languages, the compact prompt's shape, expression_edit, and the dev-set accuracy gate."""

from __future__ import annotations

import json

import pytest

from facefuse.cli import main
from facefuse.core.errors import InvalidInput
from facefuse.prompt import commands
from facefuse.prompt.evaluate import (
    INSTRUCTION_SETS,
    INSTRUCTIONS_DEV,
    load_labelled,
    score_instructions,
)
from facefuse.prompt.optimizer import optimize
from facefuse.prompt.structured import ParsedInstruction, expression_edit, parse_instruction
from facefuse.prompt.tokenizer import build_clip_tokenizer

SLIGHT, SMILING, BIG = "slight smile", "smiling", "big smile"
NEUTRAL, OPEN = "neutral expression", "open mouth"


@pytest.fixture(scope="module")
def tok():
    return build_clip_tokenizer()


def attrs(text: str) -> dict:
    return parse_instruction(text).attributes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # the failures
        ("give him a big grin", {"expression": BIG}),
        ("a slight smile please", {"expression": SLIGHT}),
        ("make them stop smiling", {"expression": NEUTRAL}),
        ("close her eyes", {"eyes": "closed"}),
        # paraphrases
        ("grin", {"expression": SMILING}),
        ("beaming", {"expression": BIG}),
        ("look happy", {"expression": SMILING}),
        ("a warm smile please", {"expression": SMILING}),
        ("slight smile", {"expression": SLIGHT}),
        ("big smile", {"expression": BIG}),
        ("big grin", {"expression": BIG}),
        ("make him smile a bit", {"expression": SLIGHT}),
        # negations
        ("don't smile", {"expression": NEUTRAL}),
        ("no smile", {"expression": NEUTRAL}),
        ("stop smiling", {"expression": NEUTRAL}),
        ("serious", {"expression": NEUTRAL}),
        ("keep a neutral expression", {"expression": NEUTRAL}),
        ("remove the smile", {"expression": NEUTRAL}),
        ("he shouldn't be smiling", {"expression": NEUTRAL}),
        # eyes and mouth
        ("open eyes", {"eyes": "open"}),
        ("don't close the eyes", {"eyes": "open"}),  # two flips: a negated close
        ("open mouth", {"expression": OPEN}),
        ("mouth open", {"expression": OPEN}),
        ("big smile with mouth open", {"expression": BIG, "mouth": "open"}),
        ("keep his blue eyes", {"eyes": "blue"}),  # a colour stays a colour
        ("eyes should not be closed", {"eyes": "open"}),  # a negation inside the state
        # keep / remove items, lighting, style
        ("keep the glasses", {"glasses": True}),
        ("remove the glasses", {"glasses": False}),
        ("keep the hair", {"hair": True}),
        ("don't remove the glasses", {"glasses": True}),
        ("remove the earrings and the necklace", {"earrings": False, "necklace": False}),
        ("add round glasses", {"glasses": "round"}),
        ("make him clean-shaven", {"beard": False}),
        ("studio lighting and a white background", {"lighting": "studio", "background": "white"}),
        ("black and white background", {"background": "black and white"}),  # one binomial
        ("soft studio light", {"lighting": "soft studio"}),
        ("make it black and white", {"style": "black and white"}),
    ],
)
def test_english_instructions(text, expected):
    assert attrs(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("微笑", {"expression": SMILING}),
        ("大笑", {"expression": BIG}),
        ("别笑", {"expression": NEUTRAL}),
        ("不要笑", {"expression": NEUTRAL}),
        ("没有笑容", {"expression": NEUTRAL}),
        ("保持中性表情", {"expression": NEUTRAL}),
        ("不苟言笑", {"expression": NEUTRAL}),  # one word, not 不 + 笑
        ("保留眼镜", {"glasses": True}),
        ("去掉眼镜", {"glasses": False}),
        ("眼镜不要了", {"glasses": False}),  # the removal after the item
        ("不要去掉眼镜", {"glasses": True}),  # two flips
        ("柔和的灯光", {"lighting": "soft"}),
        ("柔和的影棚灯光", {"lighting": "soft studio"}),
        ("让他微笑", {"expression": SMILING}),
        ("请让她笑一笑", {"expression": SMILING}),
        ("稍微笑一下", {"expression": SLIGHT}),
        ("笑得很灿烂", {"expression": BIG}),
        ("黑白照片", {"style": "black and white"}),
        ("张嘴", {"expression": OPEN}),
        ("闭上眼睛", {"eyes": "closed"}),
        ("不要闭眼", {"eyes": "open"}),
        ("嘴巴微微张开", {"expression": OPEN}),  # part and state apart
        ("保留胡子和眼镜", {"beard": True, "glasses": True}),
        ("请保持中性表情并保留眼镜", {"expression": NEUTRAL, "glasses": True}),
        ("make him 微笑", {"expression": SMILING}),
        ("別笑，保留眼鏡", {"expression": NEUTRAL, "glasses": True}),  # traditional characters
        ("張嘴大笑", {"expression": BIG, "mouth": "open"}),
        ("remove 眼镜", {"glasses": False}),  # the English verb reaches the Chinese item
        ("不要 smile", {"expression": NEUTRAL}),  # and the Chinese negator the English smile
        ("不要有任何表情", {"expression": NEUTRAL}),  # a negated 表情
        ("别笑, soft studio light", {"expression": NEUTRAL, "lighting": "soft studio"}),
    ],
)
def test_chinese_and_mixed_instructions(text, expected):
    assert attrs(text) == expected


@pytest.mark.parametrize(
    ("text", "expected", "loser"),
    [
        ("smile, don't smile", NEUTRAL, SMILING),
        ("don't smile, smile", SMILING, NEUTRAL),
        ("别笑，微笑", SMILING, NEUTRAL),
        ("微笑，别笑", NEUTRAL, SMILING),
    ],
)
def test_the_later_clause_wins_and_a_warning_says_so(tok, text, expected, loser):
    parsed = parse_instruction(text)
    assert parsed.attributes == {"expression": expected}
    (warning,) = parsed.warnings
    assert "contradiction" in warning and "later clause wins" in warning
    assert loser in warning and warning.endswith(expected)
    result = optimize(text, tok)
    assert result.info()["warnings"] == [warning]  # the warnings go into INFO
    shown = {NEUTRAL: "neutral expression", SMILING: "smiling"}
    assert result.prompt == shown[expected]  # the overridden clause is not in the prompt


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("smile. no, don't", {"expression": NEUTRAL}),  # a bare negation negates the clause before
        ("grin, wait, make it subtle", {"expression": SLIGHT}),  # a bare strength: the smile's
        ("don't smile, make it bigger", {"expression": NEUTRAL}),  # no smile to make bigger
        ("摘掉眼镜，算了还是留着吧", {"glasses": True}),  # a bare verb: the item named last
        ("眼镜别摘", {"glasses": True}),  # 别 + 摘 after the item: two flips
        ("笑容收一收", {"expression": NEUTRAL}),
        ("smile, no actually don't", {"expression": NEUTRAL}),  # "no" does not cancel "don't"
        ("保留眼镜，其实还是摘掉吧", {"glasses": False}),
    ],
)
def test_follow_up_clauses_amend_the_clause_before(text, expected):
    assert attrs(text) == expected


def test_later_removal_wins_for_items_too(tok):
    result = optimize("keep the glasses, remove the glasses", tok)
    assert result.attributes == {"glasses": False}
    assert result.negative_prompt.endswith(", glasses")
    assert "glasses" not in result.prompt
    assert attrs("remove the glasses, actually keep them") == {"glasses": True}


@pytest.mark.parametrize(
    "text", ["sourire s'il vous plaît", "улыбнись, пожалуйста", "ابتسم", "sonrie por favor"]
)
def test_unknown_language_is_served_with_a_warning(tok, text):
    result = optimize(text, tok)  # no error: the request is served
    assert result.attributes == {}
    assert result.prompt  # passed on as written
    assert any("nothing in the instruction was understood" in w for w in result.warnings)
    assert expression_edit(result.attributes) == {"reset": False, "smile": 0.0, "mouth_open": 0.0}


def test_known_languages_and_plain_descriptions_get_no_language_warning(tok):
    for text in ("make her smile", "让他微笑", "red tower, blue bridge", "a bowl of soup"):
        assert not any("understood" in w for w in optimize(text, tok).warnings), text


def test_a_clause_in_an_unknown_script_is_named_when_the_rest_is_understood():
    parsed = parse_instruction("make her smile, улыбнись")
    assert parsed.attributes == {"expression": SMILING}
    assert any("not understood" in w and "улыбнись" in w for w in parsed.warnings)


# --- the compact prompt -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "prompt"),
    [
        ("make her smile, keep the hair, soft studio light", "smiling, hair, soft studio light"),
        ("make him smile, keep the glasses", "smiling, glasses"),
        ("a slight smile please", "smiling"),  # the trained caption
        ("give him a big grin", "big smile"),
        ("make them stop smiling", "neutral expression"),
        ("close her eyes", "closed eyes"),
        ("smile with an open mouth", "smiling, open mouth"),
        ("让他微笑，保留眼镜，柔和的灯光", "smiling, glasses, soft light"),
        ("黑白照片, 大笑", "black and white photo, big smile"),
    ],
)
def test_compact_prompt_is_comma_separated_trained_words(tok, text, prompt):
    assert optimize(text, tok).prompt == prompt


def test_trained_words_only():
    """The words of every rendered face-edit attribute are words of the training captions."""
    from facefuse.train.data import CAPTIONS, DISTRACTORS

    trained = {w for c in CAPTIONS.values() for p in c for w in p.split()}
    trained |= {w for p in DISTRACTORS for w in p.split()}
    for text in ("slight smile", "smile", "big grin", "don't smile", "keep the glasses", "黑白"):
        for tag in optimize_tags(text):
            assert set(tag.split()) <= trained, (text, tag)


def optimize_tags(text: str) -> list[str]:
    from facefuse.prompt.optimizer import optimize_text

    return optimize_text(text).split(", ")


def test_removal_only_instruction_still_has_a_prompt(tok):
    result = optimize("remove the glasses", tok)
    assert result.prompt == "portrait"  # a trained caption that says nothing more
    assert result.negative_prompt.endswith("glasses")


def test_description_keeps_its_words_and_compact_join(tok):
    # a txt2img description is not rewritten into edit words where it says more
    result = optimize("portrait of a smiling woman with red hair, studio light", tok)
    assert "portrait smiling woman" in result.prompt and result.attributes["expression"] == SMILING


# --- expression_edit --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attributes", "edit"),
    [
        ({"expression": SLIGHT}, {"reset": False, "smile": 0.5, "mouth_open": 0.0}),
        ({"expression": SMILING}, {"reset": False, "smile": 1.0, "mouth_open": 0.0}),
        ({"expression": BIG}, {"reset": False, "smile": 1.5, "mouth_open": 0.0}),
        ({"expression": NEUTRAL}, {"reset": True, "smile": 0.0, "mouth_open": 0.0}),
        ({"expression": OPEN}, {"reset": False, "smile": 0.0, "mouth_open": 1.0}),
        ({"expression": BIG, "mouth": "open"}, {"reset": False, "smile": 1.5, "mouth_open": 1.0}),
        ({}, {"reset": False, "smile": 0.0, "mouth_open": 0.0}),
        ({"glasses": True, "lighting": "soft"}, {"reset": False, "smile": 0.0, "mouth_open": 0.0}),
        ({"expression": "laughing"}, {"reset": False, "smile": 1.5, "mouth_open": 0.0}),
        ({"expression": 3}, {"reset": False, "smile": 0.0, "mouth_open": 0.0}),
    ],
)
def test_expression_edit_values(attributes, edit):
    got = expression_edit(attributes)
    assert got == edit
    assert list(got) == ["reset", "smile", "mouth_open"]
    assert type(got["reset"]) is bool and all(
        type(got[k]) is float for k in ("smile", "mouth_open")
    )


def test_expression_edit_from_instructions_and_info(tok):
    cases = {
        "make them stop smiling": (True, 0.0, 0.0),
        "a slight smile please": (False, 0.5, 0.0),
        "张嘴大笑": (False, 1.5, 1.0),
        "keep the glasses": (False, 0.0, 0.0),
    }
    for text, (reset, smile, mouth) in cases.items():
        edit = optimize(text, tok).info()["expression_edit"]
        assert edit == {"reset": reset, "smile": smile, "mouth_open": mouth}, text


# --- labelled sets and the accuracy gate ------------------------------------------------------


def test_labelled_sets_are_well_formed_and_separate():
    rows = {path.name: load_labelled(path) for path in INSTRUCTION_SETS}
    dev = rows[INSTRUCTIONS_DEV.name]
    assert len(dev) >= 150 and sum(r["lang"] == "zh" for r in dev) >= 60
    texts = [r["text"] for rs in rows.values() for r in rs]
    assert len(texts) == len(set(texts))  # no instruction in two sets
    assert sum(len(rs) for name, rs in rows.items() if "heldout" in name) >= 50


def test_dev_set_accuracy_gate():
    scores, misses = score_instructions(load_labelled(INSTRUCTIONS_DEV))
    for lang in ("en", "zh"):
        assert scores[lang].count >= 60
        assert scores[lang].attributes >= 0.95, (lang, misses)
    assert scores["other"].instructions == 1.0  # each unknown language is said so


def test_scoring_counts_wrong_missing_and_extra_attributes():
    rows = [
        {"text": "a", "lang": "en", "attributes": {"expression": SMILING, "glasses": True}},
        {"text": "b", "lang": "en", "attributes": {}},
    ]
    found = {"a": {"expression": SMILING, "hat": True}, "b": {}}
    scores, misses = score_instructions(rows, lambda t: ParsedInstruction(found[t]))
    en = scores["en"]
    assert (en.attributes_right, en.attributes_total) == (1, 3)  # glasses missed, hat extra
    assert en.instructions_right == 0  # "b" did not warn that nothing was understood
    assert [m.text for m in misses] == ["a", "b"]


def test_load_labelled_refuses_malformed_rows(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "smile", "lang": "en"}\n', encoding="utf-8")
    with pytest.raises(InvalidInput, match="attributes"):
        load_labelled(bad)
    bad.write_text("not json\n", encoding="utf-8")
    with pytest.raises(InvalidInput, match="JSON"):
        load_labelled(bad)


def test_cli_instruction_eval(capsys, tmp_path):
    path = tmp_path / "set.jsonl"
    rows = [
        {"text": "make him smile", "lang": "en", "attributes": {"expression": SMILING}},
        {"text": "别笑", "lang": "zh", "attributes": {"expression": SMILING}},  # wrong label
    ]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows), encoding="utf-8")
    assert main(["prompt-eval", "--instructions", str(path), "--json", "--worst", "5"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)["set.jsonl"]
    assert report["en"]["attributes"] == 1.0 and report["zh"]["attributes"] == 0.0
    assert "别笑" in err
    assert main(["prompt-eval", "--instructions", str(path)]) == 0
    assert "attributes right" in capsys.readouterr().out
    commands._tokenizer.cache_clear()
