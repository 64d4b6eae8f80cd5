"""A/B routing and FP32 fallback in the pipeline model, with Triton's pieces replaced by fakes."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from facefuse.runtime.memory import MIB, MemoryReading
from facefuse.runtime.variants import ABRouter, VariantRoutes


def test_ab_router_sends_exactly_the_configured_share():
    for share in (0.0, 0.1, 0.25, 1 / 3, 0.5, 1.0):
        router = ABRouter(share)
        picks = [router.next_is_candidate() for _ in range(120)]
        assert sum(picks) == int(120 * share + 1e-9), share
    router = ABRouter(0.5)
    assert [router.next_is_candidate() for _ in range(4)] == [False, True, False, True]
    with pytest.raises(ValueError, match="share"):
        ABRouter(1.5)


def test_routes_pick_models_for_candidate_and_after_fallback():
    routes = VariantRoutes("fp32", "int8", 0.5)
    assert routes.pick("fp32") == (
        "fp32",
        {
            "text_encoder": "text_encoder",
            "unet": "unet",
            "unet_deep": "unet_deep",
            "unet_shallow": "unet_shallow",
            "vae_encoder": "vae_encoder",
            "vae_decoder": "vae_decoder",
        },
    )
    variant, models = routes.pick("fp32")
    assert variant == "int8" and models["unet"] == "unet_int8"
    assert models["unet_shallow"] == "unet_shallow_int8"
    gpu = VariantRoutes("fp16", None, 0.9)
    assert gpu.pick("fp16")[0] == "fp16"  # no candidate: the share is ignored
    variant, models = gpu.pick("fp32")  # after a fallback
    assert variant == "fp32" and models["unet"] == "unet_fp32"
    assert models["vae_decoder"] == "vae_decoder_fp32" and models["text_encoder"] == "text_encoder"
    with pytest.raises(ValueError, match="variant must be one of"):
        VariantRoutes("int4")


class _Counter:
    """Stands in for TritonMetric: records increments by labels."""

    instances: ClassVar[list] = []

    def __init__(self, name, description, kind="counter", **labels):
        self.name, self.labels, self.counts = name, labels, {}
        _Counter.instances.append(self)

    def increment(self, value=1, **labels):
        key = tuple(sorted({**self.labels, **labels}.items()))
        self.counts[key] = self.counts.get(key, 0) + value


@pytest.fixture
def pipeline_model(monkeypatch, tmp_path):
    """A PipelineTritonModel whose stages record which Triton models they would call."""
    from facefuse.diffusion.manifest import PipelineManifest
    from facefuse.models.tiny import SD1_SCHEDULER
    from facefuse.serving import triton_pipeline

    (tmp_path / "1").mkdir()
    PipelineManifest("m", 256, 8, 64, 0, SD1_SCHEDULER).save(tmp_path / "1" / "pipeline.json")
    _Counter.instances = []
    monkeypatch.setattr(triton_pipeline, "TritonMetric", _Counter)
    monkeypatch.setattr(
        triton_pipeline, "bls_stages", lambda models=None, deep_cache=False: dict(models or {})
    )
    monkeypatch.setattr(triton_pipeline, "error_response", lambda exc, model: f"error: {exc}")

    class Model(triton_pipeline.PipelineTritonModel):
        oom_models: ClassVar[set] = set()

        def handle(self, request):
            unet = self.pipeline.stages.get("unet", "unet")
            if unet in self.oom_models:
                raise RuntimeError(f"call to model '{unet}' failed: CUDA out of memory")
            return (self.pipeline.variant, unet)

    def make(memory: MemoryReading | None = None, **params):
        monkeypatch.setattr(triton_pipeline, "gpu_free", lambda: memory)
        config = {
            "name": "facefusion",
            "parameters": {k: {"string_value": str(v)} for k, v in params.items()},
        }
        model = Model()
        model.initialize(
            {
                "model_config": json.dumps(config),
                "model_repository": str(tmp_path),
                "model_version": "1",
            }
        )
        return model

    return make


def _counts(name):
    (metric,) = [m for m in _Counter.instances if m.name == name]
    return {dict(k).get("variant", dict(k).get("at")): v for k, v in metric.counts.items()}


def test_a_share_of_requests_runs_the_candidate_and_both_are_counted(pipeline_model):
    from facefuse.core import metrics

    model = pipeline_model(precision="fp32", candidate_variant="int8", candidate_share="0.25")
    responses = model.execute(list(range(8)))
    assert responses.count(("int8", "unet_int8")) == 2
    assert responses.count(("fp32", "unet")) == 6
    assert _counts(metrics.PIPELINE_REQUESTS) == {"fp32": 6, "int8": 2}
    # loading the model draws nothing: the split starts with the first request
    half = pipeline_model(precision="fp32", candidate_variant="int8", candidate_share="0.5")
    assert [variant for variant, _ in half.execute([0, 1, 2, 3])] == ["fp32", "int8"] * 2


def test_oom_at_run_time_switches_to_fp32_and_retries(pipeline_model):
    from facefuse.core import metrics

    model = pipeline_model(precision="fp16", fallback_margin_mb="2048")  # no reading: kept
    assert model.variant == "fp16"
    model.oom_models = {"unet"}
    assert model.execute([0, 1]) == [("fp32", "unet_fp32"), ("fp32", "unet_fp32")]
    assert _counts(metrics.PIPELINE_FALLBACKS) == {"run": 1}
    assert _counts(metrics.PIPELINE_REQUESTS) == {"fp32": 2}
    model.oom_models = {"unet_fp32"}  # FP32 itself runs out: a clean error, no loop
    (response,) = model.execute([2])
    assert response.startswith("error:") and "out of memory" in response


def test_low_gpu_memory_at_load_starts_on_fp32(pipeline_model):
    from facefuse.core import metrics

    model = pipeline_model(
        MemoryReading(900 * MIB, "NVML"), precision="fp16", fallback_margin_mb="2048"
    )
    assert model.variant == "fp32" and _counts(metrics.PIPELINE_FALLBACKS) == {"load": 1}
    assert model.execute([0]) == [("fp32", "unet_fp32")]
    roomy = pipeline_model(
        MemoryReading(30000 * MIB, "NVML"), precision="fp16", fallback_margin_mb="2048"
    )
    assert roomy.execute([0]) == [("fp16", "unet")]
