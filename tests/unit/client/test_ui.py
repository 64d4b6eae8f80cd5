"""The page's handlers without a browser: INFO as a person reads it, errors as sentences naming
the field, a dead server said so quickly, loopback by default, and the page's layout."""

from __future__ import annotations

import importlib.util
import socket
import time

import pytest
from facefuse.client.ui import (
    LiveSession,
    Page,
    check_bind,
    expression_options,
    format_info,
    live_frame,
    server_message,
)

from facefuse.core.errors import Busy, InvalidInput, NoFaceFound

INFO = {
    "tokens_before": 21, "tokens_after": 12, "cache_hit_tokens": [9], "asked": "edit",
    "steps": 20, "steps_run": 8, "steps_policy": "adaptive", "scheduler": "ddim",
    "unet_calls": 8, "variant": "int8", "model_id": "faces",
    "expression": {"source": "target", "smile": 0.8, "mouth_open": 0.25},
    "faces": {"found": 2, "fused": [0, 1], "select": "all"},
    "stage_ms": {"face": 40.0, "text_encoder": 5.5, "denoise": 300.0},
}  # fmt: skip


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_info_reads_as_sentences():
    text = format_info(INFO)
    assert (
        "21 CLIP tokens, 12 after compression; the text encoder reused 9 cached prefix tokens"
        in text
    )
    assert "8 of 20 steps (adaptive, ddim)" in text
    assert "the int8 variant of faces" in text
    assert "B's expression, smile +0.80 on top, mouth open +0.25 on top" in text
    assert "2 found in B, fused: 1, 2 (all)" in text
    assert "346 ms (face analysis 40, text encoder 6, denoising 300)" in text
    assert "plain swap" in format_info({**INFO, "asked": "nothing"})
    assert format_info({}) == "(no INFO)"


def test_errors_become_one_sentence_naming_the_field():
    assert server_message(NoFaceFound("TARGET_IMAGE"), "x").startswith("**TARGET_IMAGE**: no face")
    assert "busy" in server_message(Busy("8 streams open"), "x").lower()
    down = server_message(ConnectionError("failed to connect"), "127.0.0.1:9")
    assert "127.0.0.1:9" in down and "press the button again" in down


def test_expression_sliders_only_when_asked():
    assert expression_options(False, 1.0, 0.5, "target") == {"expression_source": "target"}
    manual = expression_options(True, 1.0, 0.5, "source")
    assert manual == {"expression_source": "source", "expression_smile": 1.0,
                      "expression_mouth_open": 0.5}  # fmt: skip


def test_the_page_binds_loopback_unless_allowed():
    check_bind("127.0.0.1", False)
    with pytest.raises(InvalidInput, match="--host"):
        check_bind("0.0.0.0", False)
    check_bind("0.0.0.0", True)


def test_missing_files_and_a_dead_server_are_said_on_the_page(tmp_path, sample_images):
    page = Page(dead_url())
    try:
        image, _info, status = page.fuse_photo(None, None, "", False, 0, 0, "target", "largest")
        assert image is None and "A (source photo)" in status and "missing" in status
        (tmp_path / "a.jpg").write_bytes(sample_images[0])
        started = time.monotonic()
        _, _, status = page.fuse_photo(str(tmp_path / "a.jpg"), str(tmp_path / "a.jpg"), "",
                                       False, 0, 0, "target", "largest")  # fmt: skip
        assert "No answer from the Triton server" in status
        assert time.monotonic() - started < 20  # asked once, not retried for minutes
        video, status = page.fuse_clip(str(tmp_path / "a.jpg"), str(tmp_path / "a.jpg"), "",
                                       False, 0, 0, "target", "largest")  # fmt: skip
        assert video is None and "B (video)" in status
    finally:
        page.close()
    assert not page.workdir.exists()  # nothing kept after the page stops


def test_a_live_stream_to_a_dead_server_reports_instead_of_hanging(sample_images):
    import numpy as np

    live = LiveSession(dead_url(), sample_images[0], "", {})
    assert live.done.wait(timeout=30)
    with pytest.raises(Exception, match=r"(?i)connect|unavailable"):
        live.push(np.zeros((64, 64, 3), np.uint8))
    assert live_frame(Page(dead_url()), "s", None, None, "", "largest")[1] == (
        "Waiting for the camera."
    )


@pytest.mark.skipif(importlib.util.find_spec("gradio") is None, reason="the ui extra")
def test_the_page_has_every_control():
    from facefuse.client.ui import build_app

    page = Page(dead_url())
    try:
        app = build_app(page)
        ids = {block.elem_id for block in app.blocks.values() if block.elem_id}
    finally:
        page.close()
    wanted = {"a", "b", "out", "instruction", "fuse", "status", "info", "reference", "vb",
              "vout", "vfuse", "cam", "lout", "lstats", "prompt", "generate", "tout"}  # fmt: skip
    assert wanted <= ids
