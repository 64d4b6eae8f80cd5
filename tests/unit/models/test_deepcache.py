"""DeepCache: the UNet split into a deep graph and a shallow one, and the loop that uses them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from facefuse.diffusion.loop import DeepCacheUnets, LoopRequest, denoise, make_scheduler
from facefuse.models.deepcache import DeepUnet, ShallowUnet
from facefuse.models.tiny import SD1_SCHEDULER, TINY, build_unet


def _inputs(unet, batch=2, seed=0):
    generator = torch.Generator().manual_seed(seed)
    size = unet.config.sample_size
    sample = torch.randn(batch, unet.config.in_channels, size, size, generator=generator)
    context = torch.randn(batch, 77, unet.config.cross_attention_dim, generator=generator)
    return sample, torch.tensor([700.0, 30.0][:batch]), context


@torch.no_grad()
def test_deep_graph_is_the_unet_and_shallow_on_its_features_is_too():
    unet = build_unet(TINY, seed=0).eval()
    sample, t, context = _inputs(unet)
    reference = unet(sample, t, context).sample
    noise, deep = DeepUnet(unet)(sample, t, context)
    assert torch.equal(noise, reference)
    assert torch.allclose(ShallowUnet(unet)(sample, t, context, deep), reference, atol=1e-6)
    # another step's features give another answer: the cache is an approximation
    other = DeepUnet(unet)(*_inputs(unet, seed=1))[1]
    assert not torch.allclose(ShallowUnet(unet)(sample, t, context, other), reference, atol=1e-3)


def test_unsupported_unets_are_refused_naming_the_field():
    unet = build_unet(TINY, seed=0)
    unet.register_to_config(class_embed_type="timestep")
    with pytest.raises(ValueError, match="class_embed_type"):
        DeepUnet(unet)


class _Counting:
    """Fake pair: records which graph ran at each call and the rows of the deep it got."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def plain(self, sample, timestep, context):
        self.calls.append(("unet", len(sample)))
        return 0.1 * sample

    def deep(self, sample, timestep, context):
        self.calls.append(("deep", len(sample)))
        return 0.1 * sample, np.full((len(sample), 3, 2, 2), len(self.calls), np.float32)

    def shallow(self, sample, timestep, context, deep):
        assert len(deep) == len(sample)  # the cached rows match the call's rows
        self.calls.append(("shallow", int(deep[0, 0, 0, 0])))
        return 0.1 * sample


def _request(**kwargs) -> LoopRequest:
    cond = np.zeros((77, 8), np.float32)
    base = dict(cond=cond, uncond=cond, steps=7, guidance=3.0, seed=0, latent_shape=(4, 8, 8))
    return LoopRequest(**{**base, **kwargs})


def test_interval_runs_deep_every_n_steps_and_shallow_on_the_latest_features_between():
    fake = _Counting()
    scheduler = make_scheduler("ddim", SD1_SCHEDULER)
    result = denoise(
        fake.plain,
        scheduler,
        _request(deep_cache_interval=3),
        DeepCacheUnets(fake.deep, fake.shallow),
    )
    kinds = [kind for kind, _ in fake.calls]
    assert kinds == ["deep", "shallow", "shallow", "deep", "shallow", "shallow", "deep"]
    assert fake.calls[1] == ("shallow", 1) and fake.calls[4] == ("shallow", 4)
    assert result.unet_calls == 7 and result.shallow_calls == 4


def test_interval_one_calls_the_plain_unet_and_truncated_cfg_slices_the_cached_rows():
    fake = _Counting()
    scheduler = make_scheduler("ddim", SD1_SCHEDULER)
    pair = DeepCacheUnets(fake.deep, fake.shallow)
    denoise(fake.plain, scheduler, _request(), pair)
    assert {kind for kind, _ in fake.calls} == {"unet"}
    fake.calls.clear()
    # CFG off for the last half: shallow steps then get the conditional row only
    denoise(fake.plain, scheduler, _request(deep_cache_interval=2, cfg_truncation=0.5), pair)
    assert [k for k, _ in fake.calls][:2] == ["deep", "shallow"] and len(fake.calls) == 7


def test_an_interval_without_the_pair_or_below_one_is_refused():
    scheduler = make_scheduler("ddim", SD1_SCHEDULER)
    with pytest.raises(ValueError, match="unet_deep"):
        denoise(_Counting().plain, scheduler, _request(deep_cache_interval=2))
    with pytest.raises(ValueError, match=">= 1"):
        denoise(_Counting().plain, scheduler, _request(deep_cache_interval=0))


def test_pipeline_options_come_from_the_config_parameters_and_bad_values_name_it():
    from facefuse.diffusion.pipeline import options_from_parameters

    options = options_from_parameters({"deep_cache_interval": "3", "scheduler": "unipc"})
    assert options["deep_cache_interval"] == 3 and options["scheduler"] == "unipc"
    assert options_from_parameters({})["deep_cache_interval"] == 1
    with pytest.raises(ValueError, match="deep_cache_interval must be a number, got 'two'"):
        options_from_parameters({"deep_cache_interval": "two"})
    with pytest.raises(ValueError, match="deep_cache_interval must be >= 1"):
        options_from_parameters({"deep_cache_interval": "0"})
