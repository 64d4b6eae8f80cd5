"""Compression rules for verbose descriptions, the identity-first guard and single normalisation."""

from __future__ import annotations

import pytest

from facefuse.prompt import compress as compress_module
from facefuse.prompt import optimizer, structured
from facefuse.prompt.compress import compress, normalize
from facefuse.prompt.optimizer import optimize_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("close-up portrait of a woman", "closeup portrait woman"),  # one CLIP token, not 3
        ("a close up of a man", "closeup man"),
        ("neon lights in the background", "neon lights background"),
        ("portrait in the style of a watercolor painting", "portrait watercolor painting"),
        ("a man who looks about 35 years old", "man 35 years old"),
        ("a boy of about 8 years old", "boy 8 years old"),
        ("wearing a pair of round glasses", "wearing round glasses"),
        ("looking directly at the camera", "looking at camera"),
        ("looking straight into the lens", "looking into lens"),
        ("The picture should show a woman with red hair", "picture woman red hair"),
        ("it should look like a woman with red hair", "woman red hair"),
    ],
)
def test_verbose_phrasing_is_shortened(text, expected):
    assert compress(text).text == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("portrait in the style of Thomas Gainsborough", "portrait thomas gainsborough style"),
        ("a man standing in the background", "man standing in background"),  # where he stands
        ("looking straight ahead", "looking straight ahead"),
        ("he looks tired", "looks tired"),  # only "looks" before an age goes
        ("a man who looks exactly 35", "man looks exactly 35"),
    ],
)
def test_verbose_rules_leave_meaningful_words(text, expected):
    assert compress(text).text == expected


def test_identity_noun_qualifying_a_face_is_not_moved_first():
    assert compress("sci-fi, night, sleepy fashion model face").text.startswith("sci fi")
    assert compress("night, fashion model in a red dress").text.startswith("fashion model")
    assert compress("cinematic lighting, old woman with grey hair").text.startswith("old woman")


def test_optimize_text_normalises_once(monkeypatch):
    text = "A photo of a man who is wearing glasses, highly detailed, 8 k"
    expected = compress(text).text
    calls = []

    def counting(text: str) -> str:
        calls.append(text)
        return normalize(text)

    for module in (compress_module, structured, optimizer):
        monkeypatch.setattr(module, "normalize", counting)
    assert optimize_text(text) == expected
    assert len(calls) == 1


def test_normalized_flag_skips_only_the_normalisation():
    text = "Ｐortrait of a WOMAN, close - up, 8 k, (red hair:1.2)"
    assert compress(normalize(text), normalized=True).text == compress(text).text
