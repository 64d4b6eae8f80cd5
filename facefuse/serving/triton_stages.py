"""The pipeline's :class:`Stages` as BLS calls to the other models of the repository.

Runs inside a Python-backend stub only; ``facefuse.diffusion.stages.local_stages`` is the same
pipeline in-process.
"""

from __future__ import annotations

import json

import numpy as np

from facefuse.core import contract as c
from facefuse.diffusion.loop import DeepCacheUnets
from facefuse.diffusion.pipeline import Stages
from facefuse.serving.triton_io import bls, bytes_array


def bls_stages(models: dict[str, str] | None = None, deep_cache: bool = False) -> Stages:
    """Stages that call the other models of the repository (inside a Python-backend stub).

    ``models`` maps ``unet``/``unet_deep``/``unet_shallow``/``vae_encoder``/``vae_decoder``
    to the Triton model to call (``facefuse.runtime.variants.variant_model_names``: A/B
    candidate, FP32 fallback); ``deep_cache``: give the loop the DeepCache pair."""
    served = (c.UNET, c.UNET_DEEP, c.UNET_SHALLOW, c.VAE_ENCODER, c.VAE_DECODER)
    names = {m.name: m.name for m in served}
    names.update({k: v for k, v in (models or {}).items() if k in names})

    def analyze_faces(source: bytes, target: bytes, size: int):
        out = bls(
            c.FACE_ANALYZER.name,
            {
                c.SOURCE_IMAGE.name: bytes_array(source),
                c.TARGET_IMAGE.name: bytes_array(target),
                c.SIZE.name: c.SIZE.scalar(size),
            },
            (c.COMPOSITE.name, c.MASK.name, c.CROP_BOX.name),
        )
        return out[c.COMPOSITE.name], out[c.MASK.name], out[c.CROP_BOX.name]

    def analyze_faces_expression(
        source: bytes, target: bytes, size: int, expression: str, reference: bytes | None = None
    ):
        inputs = {
            c.SOURCE_IMAGE.name: bytes_array(source),
            c.TARGET_IMAGE.name: bytes_array(target),
            c.SIZE.name: c.SIZE.scalar(size),
            c.EXPRESSION.name: bytes_array(expression.encode("utf-8")),
        }
        if reference is not None:
            inputs[c.REFERENCE_FACE.name] = bytes_array(reference)
        out = bls(c.FACE_ANALYZER.name, inputs, c.FACE_ANALYZER.output_names)
        info = json.loads(out[c.INFO.name].reshape(-1)[0])
        return out[c.COMPOSITE.name], out[c.MASK.name], out[c.CROP_BOX.name], info

    def optimize_prompt(instruction: str):
        out = bls(
            c.PROMPT_OPTIMIZER.name,
            {c.INSTRUCTION.name: bytes_array(instruction.encode("utf-8"))},
            c.PROMPT_OPTIMIZER.output_names,
        )
        info = json.loads(out[c.INFO.name].reshape(-1)[0])
        return out[c.PROMPT_IDS.name], out[c.NEGATIVE_IDS.name], info

    def encode_text(ids: np.ndarray):
        out = bls(
            c.TEXT_ENCODER.name,
            {c.INPUT_IDS.name: ids},
            (c.LAST_HIDDEN_STATE.name, c.CACHE_HIT_TOKENS.name),
        )
        return out[c.LAST_HIDDEN_STATE.name], out[c.CACHE_HIT_TOKENS.name].reshape(-1)

    def encode_image(image: np.ndarray):
        out = bls(names[c.VAE_ENCODER.name], {c.PIXELS.name: image}, (c.LATENT.name,))
        return out[c.LATENT.name]

    def unet_inputs(sample: np.ndarray, timestep: np.ndarray, context: np.ndarray) -> dict:
        return {
            c.SAMPLE.name: sample,
            c.TIMESTEP.name: timestep.reshape(-1, 1).astype(np.float32),
            c.ENCODER_HIDDEN_STATES.name: context,
        }

    def unet(sample: np.ndarray, timestep: np.ndarray, context: np.ndarray):
        inputs = unet_inputs(sample, timestep, context)
        return bls(names[c.UNET.name], inputs, (c.NOISE_PRED.name,))[c.NOISE_PRED.name]

    def unet_deep(sample: np.ndarray, timestep: np.ndarray, context: np.ndarray):
        inputs = unet_inputs(sample, timestep, context)
        out = bls(names[c.UNET_DEEP.name], inputs, c.UNET_DEEP.output_names)
        return out[c.NOISE_PRED.name], out[c.DEEP.name]

    def unet_shallow(sample, timestep, context, deep):
        inputs = {**unet_inputs(sample, timestep, context), c.DEEP.name: deep}
        return bls(names[c.UNET_SHALLOW.name], inputs, (c.NOISE_PRED.name,))[c.NOISE_PRED.name]

    def decode_latents(latents: np.ndarray):
        out = bls(names[c.VAE_DECODER.name], {c.LATENT.name: latents}, (c.PIXELS.name,))
        return out[c.PIXELS.name]

    pair = DeepCacheUnets(unet_deep, unet_shallow) if deep_cache else None
    return Stages(
        analyze_faces,
        optimize_prompt,
        encode_text,
        encode_image,
        unet,
        decode_latents,
        pair,
        analyze_faces_expression,
    )
