"""The limits that keep hostile requests cheap: raw tensor shapes, optional text, and the
denoising loop's cancellation hook (a cancelled request must stop consuming the slot)."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.core.errors import InvalidInput
from facefuse.core.limits import DEFAULT_LIMITS, check_optional_text, check_tensor
from facefuse.diffusion.loop import DenoiseCancelled, LoopRequest, denoise, make_scheduler

UNET_SAMPLE = ["batch", 4, "height", "width"]
CONTEXT = ["batch", "sequence", 64]


@pytest.mark.parametrize(
    ("shape", "expected", "message"),
    [
        ((1, 4, 8), UNET_SAMPLE, "must have 4 dimensions"),
        ((1, 3, 8, 8), UNET_SAMPLE, "dimension 1 must be 4"),
        ((1, 4, 0, 8), UNET_SAMPLE, "empty dimension"),
        ((0, 4, 8, 8), UNET_SAMPLE, "empty dimension"),
        ((1, 4, 3, 5), UNET_SAMPLE, "multiples of 8"),
        ((1, 4, 8, 136), UNET_SAMPLE, "at most 128"),
        ((1, 77, 32), CONTEXT, "dimension 2 must be 64"),
        ((1, 77 * 16 + 1, 64), CONTEXT, "sequence must be at most"),
    ],
)
def test_check_tensor_refuses_shapes_the_graph_cannot_run(shape, expected, message):
    with pytest.raises(InvalidInput, match=message) as caught:
        check_tensor(
            "sample", shape, expected, spatial_multiple=8, max_side=128, max_sequence=77 * 16
        )
    assert caught.value.field == "sample"


@pytest.mark.parametrize(
    ("shape", "expected"),
    [((2, 4, 32, 32), UNET_SAMPLE), ((16, 4, 128, 8), UNET_SAMPLE), ((2, 154, 64), CONTEXT)],
)
def test_check_tensor_accepts_what_the_pipeline_sends(shape, expected):
    check_tensor("x", shape, expected, spatial_multiple=8, max_side=128, max_sequence=77 * 16)


def test_optional_text_allows_empty_but_not_hostile():
    assert check_optional_text(None, "NEGATIVE_PROMPT") is None
    assert check_optional_text("  ", "NEGATIVE_PROMPT") == "  "
    assert check_optional_text(" blurry ", "NEGATIVE_PROMPT") == "blurry"
    with pytest.raises(InvalidInput, match="NEGATIVE_PROMPT: must be at most"):
        check_optional_text("x" * (DEFAULT_LIMITS.max_instruction_chars + 1), "NEGATIVE_PROMPT")
    with pytest.raises(InvalidInput, match="control characters"):
        check_optional_text("blurry\x00", "NEGATIVE_PROMPT")


SCHEDULER_CONFIG = {
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "num_train_timesteps": 1000,
    "prediction_type": "epsilon",
    "set_alpha_to_one": False,
    "steps_offset": 1,
}


def _request(**extra) -> LoopRequest:
    cond = np.zeros((77, 8), dtype=np.float32)
    return LoopRequest(
        cond=cond, uncond=cond, steps=10, guidance=7.5, seed=1, latent_shape=(4, 8, 8), **extra
    )


def test_loop_stops_at_the_step_after_should_stop_says_so():
    calls = []

    def unet(sample, timestep, context):
        calls.append(len(sample))
        return np.zeros_like(sample)

    asked = []

    def should_stop() -> bool:
        asked.append(True)
        return len(calls) >= 3  # the client cancels while step 3 runs

    scheduler = make_scheduler("ddim", SCHEDULER_CONFIG)
    with pytest.raises(DenoiseCancelled, match="after 3 of 10") as caught:
        denoise(unet, scheduler, _request(should_stop=should_stop))
    assert len(calls) == 3 and caught.value.steps_run == 3
    assert len(asked) == 4  # checked before every step


def test_loop_without_should_stop_runs_every_step():
    calls = []

    def unet(sample, timestep, context):
        calls.append(1)
        return np.zeros_like(sample)

    result = denoise(unet, make_scheduler("ddim", SCHEDULER_CONFIG), _request())
    assert result.steps_run == 10 and len(calls) == 10
