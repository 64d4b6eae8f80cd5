"""Per-region strength: the upper face held to a share of STRENGTH, the mouth free."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from facefuse.diffusion.loop import LoopRequest, denoise, make_scheduler
from facefuse.face.geometry import face_ellipse
from facefuse.face.mask import feathered_ellipse, upper_face_weight
from facefuse.models.tiny import SD1_SCHEDULER


def _face(angle_deg: float, size: int = 128):
    """A face of eye distance 30 px at the crop centre, turned by ``angle_deg``."""
    a = math.radians(angle_deg)
    along, down = np.array([math.cos(a), math.sin(a)]), np.array([-math.sin(a), math.cos(a)])
    mid = np.array([size / 2, size / 2 - 10])
    left, right = mid - 15 * along, mid + 15 * along
    mouth = mid + 30 * down  # about one eye distance below the eyes
    ellipse = face_ellipse(tuple(left), tuple(right))
    return feathered_ellipse(ellipse, (size, size)), (left + right) / 2, mouth


@pytest.mark.parametrize("angle", [0.0, 25.0, -30.0])
def test_eyes_are_held_and_the_mouth_is_free_also_on_tilted_faces(angle):
    mask, eyes, mouth = _face(angle)
    weight = upper_face_weight(mask, hold=0.3)
    assert weight.shape == mask.shape and weight.min() >= 0.3 and weight.max() <= 1.0
    assert weight[round(eyes[1]), round(eyes[0])] == pytest.approx(0.3, abs=1e-6)
    assert weight[round(mouth[1]), round(mouth[0])] == pytest.approx(1.0, abs=1e-6)


def test_the_split_moves_the_held_region_down_toward_the_chin():
    from facefuse.diffusion.pipeline import options_from_parameters

    mask, eyes, mouth = _face(15.0)
    shares = [upper_face_weight(mask, 0.0, split=split)[mask > 0.5].mean() for split in
              (-0.3, 0.0, 0.3, 0.9)]  # fmt: skip
    assert all(a > b for a, b in itertools.pairwise(shares)), shares
    low = upper_face_weight(mask, 0.0, split=0.9)
    assert low[round(mouth[1]), round(mouth[0])] == 0.0 == low[round(eyes[1]), round(eyes[0])]
    assert options_from_parameters({})["upper_face_split"] == 0.0
    assert options_from_parameters({"upper_face_split": "0.3"})["upper_face_split"] == 0.3
    with pytest.raises(ValueError, match=r"upper_face_split must be in \[-1, 1\], got 1.5"):
        options_from_parameters({"upper_face_split": "1.5"})


def test_hold_one_or_an_empty_mask_is_all_ones_and_bad_hold_is_refused():
    mask, _, _ = _face(0.0)
    assert np.all(upper_face_weight(mask, 1.0) == 1.0)
    assert np.all(upper_face_weight(np.zeros_like(mask), 0.2) == 1.0)
    with pytest.raises(ValueError, match="hold"):
        upper_face_weight(mask, -0.1)


def _run(strength_map, steps=8):
    rng = np.random.default_rng(0)
    known = rng.standard_normal((4, 8, 8)).astype(np.float32)
    request = LoopRequest(
        cond=np.zeros((77, 8), np.float32),
        uncond=np.zeros((77, 8), np.float32),
        steps=steps,
        guidance=1.0,
        seed=0,
        strength=1.0,
        init_latents=known,
        latent_mask=np.ones((1, 8, 8), np.float32),
        strength_map=strength_map,
    )
    # a UNet that predicts a constant: every released latent drifts away from the input
    result = denoise(
        lambda s, t, c: np.full_like(s, 0.5), make_scheduler("ddim", SD1_SCHEDULER), request
    )
    return known, result.latents


def test_a_share_of_zero_keeps_the_input_and_one_changes_nothing():
    known, free = _run(None)
    _, same = _run(np.ones((1, 8, 8), np.float32))
    np.testing.assert_array_equal(free, same)
    share = np.ones((1, 8, 8), np.float32)
    share[:, :4] = 0.0  # the top half held for the whole run
    _, held = _run(share)
    np.testing.assert_allclose(held[:, :4], known[:, :4], atol=1e-5)
    np.testing.assert_array_equal(held[:, 4:] != known[:, 4:], True)
    share[:, :4] = 0.5  # released for the last half: moves less than the free half
    _, half = _run(share)
    moved_half = np.abs(half[:, :4] - known[:, :4]).mean()
    moved_free = np.abs(free[:, :4] - known[:, :4]).mean()
    assert 0 < moved_half < moved_free


def test_held_pixels_come_from_the_composite_and_the_colour_drift_is_removed():
    from facefuse.diffusion.pipeline import restore_held_pixels

    mask, eyes, _ = _face(0.0)
    weight = upper_face_weight(mask, hold=0.0)
    rng = np.random.default_rng(1)
    composite = rng.uniform(0.2, 0.8, (128, 128, 3)).astype(np.float32)
    drift = np.array([0.1, 0.0, -0.05], np.float32)  # a warm cast over the whole decode
    decoded = np.clip(composite + drift + rng.normal(0, 0.01, composite.shape), 0, 1)
    out = restore_held_pixels(composite, decoded.astype(np.float32), mask, weight)
    assert out.dtype == np.float32 and out.shape == composite.shape
    ey, ex = round(eyes[1]), round(eyes[0])
    np.testing.assert_allclose(out[ey, ex], composite[ey, ex], atol=1e-6)  # held: the source
    region = (mask * weight)[..., None]
    mean = lambda image: (image * region).sum(axis=(0, 1)) / region.sum()  # noqa: E731
    np.testing.assert_allclose(mean(out), mean(composite), atol=2e-3)  # the cast is gone
    assert np.abs(mean(decoded) - mean(composite)).max() > 0.05  # and was there before
    # nothing regenerated (an empty mask): no shift, the decode is kept where w = 1
    empty = restore_held_pixels(composite, decoded, np.zeros_like(mask), np.ones_like(mask))
    np.testing.assert_allclose(empty, decoded, atol=1e-6)


def test_upper_face_pixels_is_parsed_and_a_bad_value_is_refused():
    from facefuse.diffusion.pipeline import Pipeline, options_from_parameters

    assert options_from_parameters({})["upper_face_pixels"] == "decoded"
    options = options_from_parameters({"upper_face_pixels": "source"})
    assert options["upper_face_pixels"] == "source"
    with pytest.raises(ValueError, match="pipeline parameter upper_face_pixels"):
        options_from_parameters({"upper_face_pixels": "latent"})
    with pytest.raises(ValueError, match="upper_face_pixels"):
        Pipeline(None, None, upper_face_pixels="latent")


def test_roundtrip_residual_gives_back_the_composite_where_diffusion_changed_nothing():
    from facefuse.diffusion.pipeline import add_roundtrip_residual, options_from_parameters

    rng = np.random.default_rng(3)
    composite = rng.random((16, 16, 3)).astype(np.float32)
    roundtrip = np.clip(composite + 0.05 * rng.standard_normal(composite.shape), 0, 1)
    mask = np.zeros((16, 16), np.float32)
    mask[4:12, 4:12] = 1.0
    # nothing changed by diffusion: the composite exactly inside the mask, the decode outside
    same = add_roundtrip_residual(composite, roundtrip, roundtrip, mask)
    np.testing.assert_allclose(same[4:12, 4:12], composite[4:12, 4:12], atol=1e-6)
    np.testing.assert_array_equal(same[0], roundtrip[0].astype(np.float32))
    # a change (a brighter patch) is carried over on top of the composite's detail
    changed = roundtrip.copy()
    changed[6:8, 6:8] += 0.2
    out = add_roundtrip_residual(composite, changed, roundtrip, mask)
    expected = np.clip(composite[6:8, 6:8] + 0.2, 0, 1)
    np.testing.assert_allclose(out[6:8, 6:8], expected, atol=1e-5)
    assert out.min() >= 0.0 and out.max() <= 1.0
    assert options_from_parameters({})["autoencoder_residual"] is False
    assert options_from_parameters({"autoencoder_residual": "TRUE"})["autoencoder_residual"]
    with pytest.raises(ValueError, match="pipeline parameter autoencoder_residual"):
        options_from_parameters({"autoencoder_residual": "yes"})
