"""Base of the BLS pipeline models ``facefusion`` and ``txt2img``.

``initialize`` loads ``pipeline.json`` (written by ``facefuse export``) and builds a
:class:`~facefuse.diffusion.pipeline.Pipeline` over BLS stages; the subclass's ``handle``
turns one request into one response. Several instances of the model run pipelines at once,
which is what lets ``unet`` form batches across requests.
"""

from __future__ import annotations

import json
from pathlib import Path

from facefuse import metrics
from facefuse.diffusion.loop import DEFAULT_SCHEDULER
from facefuse.diffusion.manifest import MANIFEST_NAME, PipelineManifest
from facefuse.diffusion.pipeline import Pipeline, params_from
from facefuse.diffusion.stages import bls_stages
from facefuse.errors import InvalidInput
from facefuse.triton_io import TritonMetric, error_response, get_scalar


class PipelineTritonModel:
    """Triton ``TritonPythonModel`` base for BLS pipelines."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.name = config["name"]
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        manifest = PipelineManifest.load(version_dir / MANIFEST_NAME)
        scheduler = params.get("scheduler", DEFAULT_SCHEDULER)
        self.pipeline = Pipeline(bls_stages(), manifest, scheduler)
        self.requests_metric = TritonMetric(
            metrics.PIPELINE_REQUESTS, "pipeline requests by model, variant and outcome"
        )

    def params(self, request, with_strength: bool = True):
        """Optional STEPS/STRENGTH/GUIDANCE/SEED with defaults, validated together."""

        def number(cast):
            def convert(value):
                try:
                    return cast(value)
                except (TypeError, ValueError, OverflowError) as exc:
                    raise InvalidInput("parameter", f"not a number: {value!r}") from exc

            return convert

        return params_from(
            steps=get_scalar(request, "STEPS", None, number(int)),
            strength=get_scalar(request, "STRENGTH", None, number(float))
            if with_strength
            else None,
            guidance=get_scalar(request, "GUIDANCE", None, number(float)),
            seed=get_scalar(request, "SEED", None, number(int)),
        )

    def handle(self, request):
        raise NotImplementedError

    def execute(self, requests):
        responses = []
        for request in requests:
            outcome = "ok"
            try:
                responses.append(self.handle(request))
            except Exception as exc:  # the boundary: one clean response per failure
                outcome = "invalid" if isinstance(exc, InvalidInput) else "error"
                responses.append(error_response(exc, self.name))
            labels = {"model": self.name, "variant": "default", "outcome": outcome}
            self.requests_metric.increment(1, **labels)
        return responses
