"""img2img: a BLS model for the served GPU measurement (``facefuse.gpu.served``).

One request = one image (uint8 [S, S, 3], S = the manifest's image size) + a prompt, through
the same :class:`~facefuse.diffusion.pipeline.Pipeline` and BLS stages as ``facefusion``:
``text_encoder`` -> ``vae_encoder`` -> the denoising loop calling ``unet`` (CFG batch of 2)
-> ``vae_decoder``. The face stage is the whole image with a full mask (plain img2img) and the
prompt is tokenised here (embedded CLIP tokenizer), so no face detector or prompt optimizer is
needed on the GPU host. Tensors between the models are host arrays (see facefuse.gpu.runtime).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from facefuse.core.errors import InvalidInput
from facefuse.diffusion.loop import DEFAULT_SCHEDULER
from facefuse.diffusion.manifest import MANIFEST_NAME, PipelineManifest
from facefuse.diffusion.pipeline import Pipeline, info_json, params_from
from facefuse.serving.triton_io import (
    get_array,
    get_scalar,
    get_text,
    pb_utils,
    respond_each,
    text_tensor,
)
from facefuse.serving.triton_stages import bls_stages


def token_ids(tokenizer, text: str) -> np.ndarray:
    out = tokenizer([text], padding="max_length", max_length=77, truncation=True)
    return np.asarray(out["input_ids"], dtype=np.int64)


class TritonPythonModel:
    def initialize(self, args):
        from facefuse.prompt.tokenizer import embedded_tokenizer

        config = json.loads(args["model_config"])
        self.name = config["name"]
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        manifest = PipelineManifest.load(version_dir / MANIFEST_NAME)
        self.size = manifest.image_size
        self.tokenizer = embedded_tokenizer()
        stages = bls_stages()
        stages.analyze_faces = self._whole_image
        stages.analyze_faces_expression = None  # the whole image, no face work
        stages.optimize_prompt = self._tokenize
        self.pipeline = Pipeline(
            stages, manifest, scheduler=params.get("scheduler", DEFAULT_SCHEDULER)
        )

    def _whole_image(self, image, _target, size):
        composite = image.astype(np.float32) / 255.0
        mask = np.ones((size, size), dtype=np.float32)
        return composite, mask, np.array([0, 0, size, size], dtype=np.int64)

    def _tokenize(self, prompt: str):
        ids, negative = token_ids(self.tokenizer, prompt), token_ids(self.tokenizer, "")
        return ids, negative, {"prompt": prompt}

    def _handle(self, request):
        pb = pb_utils()
        image = get_array(request, "IMAGE")
        if image is None or image.shape != (self.size, self.size, 3):
            got = None if image is None else list(image.shape)
            raise InvalidInput("IMAGE", f"must be uint8 [{self.size}, {self.size}, 3], got {got}")
        prompt = get_text(request, "PROMPT")
        params = params_from(
            steps=get_scalar(request, "STEPS", None, int),
            strength=get_scalar(request, "STRENGTH", None, float),
            guidance=get_scalar(request, "GUIDANCE", None, float),
            seed=get_scalar(request, "SEED", None, int),
        )
        fused, _mask, _box, info = self.pipeline.fuse(image, b"", prompt, params)
        out = (fused * 255.0 + 0.5).astype(np.uint8)
        return pb.InferenceResponse(
            output_tensors=[pb.Tensor("IMAGE", out), text_tensor("INFO", info_json(info))]
        )

    def execute(self, requests):
        return respond_each(requests, self._handle, self.name)
