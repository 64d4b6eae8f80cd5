"""Base of the BLS pipeline models ``facefusion`` and ``txt2img``.

``initialize`` loads ``pipeline.json`` (written by ``facefuse export``) and builds a
:class:`~facefuse.diffusion.pipeline.Pipeline` over BLS stages; the subclass's ``handle``
turns one request into one response. Several instances of the model run pipelines at once,
which is what lets ``unet`` form batches across requests.
"""

from __future__ import annotations

import json
from pathlib import Path

from facefuse.core import metrics
from facefuse.core.contract import GUIDANCE, SEED, STEPS, STRENGTH
from facefuse.core.errors import InvalidInput, ModelLoadError
from facefuse.diffusion.loop import DenoiseCancelled
from facefuse.diffusion.manifest import MANIFEST_NAME, PipelineManifest
from facefuse.diffusion.pipeline import Pipeline, options_from_parameters, params_from
from facefuse.runtime.memory import MIB, FallbackController, gpu_free
from facefuse.runtime.variants import VariantRoutes, variant_model_names
from facefuse.serving.triton_io import (
    ModelUnavailable,
    TritonMetric,
    error_response,
    exit_with_parent,
    get_scalar,
    set_bls_timeout,
)
from facefuse.serving.triton_stages import bls_stages


class PipelineTritonModel:
    """Triton ``TritonPythonModel`` base for BLS pipelines."""

    # seconds one BLS call to a composing model may take before the request fails with
    # UNAVAILABLE (the ``bls_timeout_s`` config parameter overrides it)
    BLS_TIMEOUT_S = 60.0

    def initialize(self, args: dict) -> None:
        exit_with_parent()  # its threads may block on a dead server: never outlive it
        config = json.loads(args["model_config"])
        self.name = config["name"]
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        raw = params.get("bls_timeout_s", str(self.BLS_TIMEOUT_S))
        try:
            set_bls_timeout(float(raw))
        except ValueError:
            raise ModelLoadError(
                f"{self.name}: parameter bls_timeout_s must be seconds in (0, 3600], got {raw!r}"
            ) from None
        version_dir = Path(args["model_repository"]) / args["model_version"]
        manifest = PipelineManifest.load(version_dir / MANIFEST_NAME)
        self.manifest = manifest
        try:
            self.pipeline_options = options_from_parameters(params)
        except ValueError as exc:  # Triton shows it as the load failure, naming the parameter
            raise ModelLoadError(f"{self.name}: {exc}") from None
        # variants: `precision` = what the base models serve; a `candidate_share` of requests
        # runs `candidate_variant` (A/B); low GPU memory / OOM switches to the fp32 models
        served = params.get("precision", "fp32")
        self.routes = VariantRoutes(
            served,
            params.get("candidate_variant") or None,
            float(params.get("candidate_share", "0")),
        )
        self.fallbacks_metric = TritonMetric(
            metrics.PIPELINE_FALLBACKS, "switches of a pipeline to the FP32 variant"
        )
        self.fallback = FallbackController(served, report=self._report_fallback)
        margin = float(params.get("fallback_margin_mb", "0")) * MIB
        if margin > 0:
            self.fallback.at_load(gpu_free(), int(margin))
        self._pipelines: dict[str, Pipeline] = {}
        current = self.fallback.variant  # the pipeline before the first request (no A/B draw)
        self._pipeline_for(current, variant_model_names(None if current == served else current))
        self.requests_metric = TritonMetric(
            metrics.PIPELINE_REQUESTS, "pipeline requests by model, variant and outcome"
        )

    def _report_fallback(self, previous: str, variant: str, reason: str, when: str) -> None:
        self.fallbacks_metric.increment(1, model=self.name, to=variant, at=when)

    def _pipeline_for(self, variant: str, models: dict[str, str]) -> Pipeline:
        """The pipeline of ``variant`` (built once), also made the current ``self.pipeline``."""
        if variant not in self._pipelines:
            deep_cache = self.pipeline_options["deep_cache_interval"] > 1
            self._pipelines[variant] = Pipeline(
                bls_stages(models, deep_cache),
                self.manifest,
                variant=variant,
                **self.pipeline_options,
            )
        self.variant, self.pipeline = variant, self._pipelines[variant]
        return self.pipeline

    def auto_steps(self, request) -> bool:
        """True when the request gives no STEPS (adaptive steps apply if configured)."""
        return get_scalar(request, STEPS.name, None, str) is None

    def _handle_routed(self, request):
        """Route the request to a variant; on OOM fall back to FP32 and run it once more."""
        self._pipeline_for(*self.routes.pick(self.fallback.variant))
        try:
            return self.handle(request)
        except Exception as exc:
            if not self.fallback.on_error(exc):
                raise
        self._pipeline_for(*self.routes.pick(self.fallback.variant))
        return self.handle(request)

    def params(self, request, with_strength: bool = True):
        """Optional STEPS/STRENGTH/GUIDANCE/SEED with defaults (STEPS and STRENGTH: the
        ``default_steps`` and ``default_strength`` parameters), validated together."""

        def number(cast):
            def convert(value):
                try:
                    return cast(value)
                except (TypeError, ValueError, OverflowError) as exc:
                    raise InvalidInput("parameter", f"not a number: {value!r}") from exc

            return convert

        steps = get_scalar(request, STEPS.name, None, number(int))
        strength = (
            get_scalar(request, STRENGTH.name, None, number(float)) if with_strength else None
        )
        return params_from(
            steps=self.pipeline.default_steps if steps is None else steps,
            strength=self.pipeline.default_strength if strength is None else strength,
            guidance=get_scalar(request, GUIDANCE.name, None, number(float)),
            seed=get_scalar(request, SEED.name, None, number(int)),
        )

    def handle(self, request):
        raise NotImplementedError

    @staticmethod
    def should_stop(request):
        """The request's cancellation check for the denoising loop (None on old servers)."""
        return getattr(request, "is_cancelled", None)

    def execute(self, requests):
        responses = []
        for request in requests:
            outcome = "ok"
            try:
                responses.append(self._handle_routed(request))
            except Exception as exc:  # the boundary: one clean response per failure
                outcome = "invalid" if isinstance(exc, InvalidInput) else "error"
                if isinstance(exc, DenoiseCancelled):
                    outcome = "cancelled"
                if isinstance(exc, ModelUnavailable):
                    outcome = "unavailable"
                responses.append(error_response(exc, self.name))
            labels = {"model": self.name, "variant": self.variant, "outcome": outcome}
            self.requests_metric.increment(1, **labels)
        return responses
