"""A plain swap needs no made-up instruction (issue 40 item 7)."""

import pytest

from facefuse.core.errors import InvalidInput
from facefuse.core.limits import check_fusion_instruction
from facefuse.prompt.plain import is_plain


@pytest.mark.parametrize(
    "text",
    ["", "   ", None, "swap the face", "face swap", "keep the expression", "Keep expression.",
     "keep her expression unchanged", "no changes", "换脸", "请换脸", "保持表情", "表情不变"],
)  # fmt: skip
def test_plain_requests(text):
    assert is_plain(text)


@pytest.mark.parametrize(
    "text", ["make him smile", "keep the glasses", "让他微笑", "swap the background to blue"]
)
def test_edits_are_not_plain(text):
    assert not is_plain(text)


def test_fusion_instruction_may_be_empty_but_not_malformed():
    assert check_fusion_instruction("") == "" and check_fusion_instruction(None) == ""
    assert check_fusion_instruction("  smile ") == "smile"
    with pytest.raises(InvalidInput, match="INSTRUCTION"):
        check_fusion_instruction("bad\x00text")
