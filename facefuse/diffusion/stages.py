"""In-process :class:`Stages`: ORT sessions on a repository's ONNX files, no server.

The served way (BLS calls to the Triton models) is ``facefuse.serving.triton_stages``; both
run exactly the same library code on the same artefacts, so comparing them measures the
server's overhead and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from facefuse.core.contract import SOURCE_IMAGE, TARGET_IMAGE
from facefuse.diffusion.loop import DeepCacheUnets
from facefuse.diffusion.pipeline import Stages


def local_stages(
    repository: str | Path,
    intra_op_threads: int = 0,
    variant: str = "fp32",
    template: str = "",
    unet_parts: tuple[int, int] | None = None,
    runtimes: Mapping[str, tuple[str, str]] | None = None,
) -> Stages:
    """The same stages in-process: ORT sessions on the repository's ONNX files, no server.

    ``variant`` picks the precision files (``facefuse.runtime.variants.variant_files``);
    ``template`` is the prompt optimizer's fixed prefix (its ``prompt_template`` parameter);
    ``unet_parts`` = (parallel runs, threads each) runs the UNet as the served ``unet`` model
    does with those parameters (``facefuse.runtime.sessions.PartsRunner``); ``runtimes``
    maps an ONNX model's name to (runtime, OpenVINO precision), as its ``runtime`` and
    ``openvino_precision`` parameters say (``facefuse.bench.e2e.served_runtimes``); a model
    not named runs on ONNX Runtime."""
    from facefuse.face.fusion import prepare_fusion
    from facefuse.face.imageio import decode_image
    from facefuse.prompt.optimizer import optimize
    from facefuse.prompt.tokenizer import load_tokenizer
    from facefuse.runtime.memory import check_cpu_fits
    from facefuse.runtime.sessions import (
        PartsRunner,
        SessionOptions,
        open_session,
        threads_per_part,
    )
    from facefuse.runtime.variants import DEEP_CACHE_MODELS, variant_files

    root = Path(repository)
    parts, unet_threads = unet_parts or (1, intra_op_threads)
    unet_threads = threads_per_part(unet_threads, parts)
    sessions = {}
    for name, file in variant_files(variant).items():
        if name in DEEP_CACHE_MODELS and not (root / name / "1" / file).is_file():
            continue  # a repository exported before DeepCache: the pipeline runs interval 1
        check_cpu_fits(root / name / "1" / file)  # a clear refusal instead of an OOM kill
        options = SessionOptions(unet_threads if name.startswith("unet") else intra_op_threads)
        runtime, precision = (runtimes or {}).get(name, ("onnxruntime", ""))
        sessions[name] = open_session(root / name / "1" / file, options, runtime, precision)
    runners = {
        name: PartsRunner(lambda feeds, name=name: sessions[name].run(None, feeds), parts)
        for name in ("unet", *DEEP_CACHE_MODELS)
        if name in sessions
    }
    tokenizer = load_tokenizer(root / "prompt_optimizer" / "1")

    def analyze_faces(source: bytes, target: bytes, size: int):
        plan = prepare_fusion(
            decode_image(source, SOURCE_IMAGE.name), decode_image(target, TARGET_IMAGE.name), size
        )
        return plan.to_arrays()

    def analyze_faces_expression(
        source: bytes, target: bytes, size: int, expression: str, reference: bytes | None = None
    ):
        from facefuse.core.contract import REFERENCE_FACE
        from facefuse.face.expression_edit import ExpressionEdit

        plan = prepare_fusion(
            decode_image(source, SOURCE_IMAGE.name),
            decode_image(target, TARGET_IMAGE.name),
            size,
            expression=ExpressionEdit.from_json(expression),
            reference_rgb=None
            if reference is None
            else decode_image(reference, REFERENCE_FACE.name),
        )
        return (*plan.to_arrays(), plan.info or {})

    def optimize_prompt(instruction: str):
        result = optimize(instruction, tokenizer, template=template)
        ids = np.asarray(result.prompt_ids, dtype=np.int64)
        return ids, np.asarray(result.negative_ids, dtype=np.int64), result.info()

    def encode_text(ids: np.ndarray):
        hidden, _ = sessions["text_encoder"].run(None, {"input_ids": ids})
        return hidden, np.zeros(len(ids), dtype=np.int32)

    def encode_image(image: np.ndarray):
        return sessions["vae_encoder"].run(None, {"image": image})[0]

    def unet_feeds(sample: np.ndarray, timestep: np.ndarray, context: np.ndarray) -> dict:
        return {"sample": sample, "timestep": timestep, "encoder_hidden_states": context}

    def unet(sample: np.ndarray, timestep: np.ndarray, context: np.ndarray):
        return runners["unet"](unet_feeds(sample, timestep, context))[0]

    def unet_deep(sample: np.ndarray, timestep: np.ndarray, context: np.ndarray):
        noise, deep = runners["unet_deep"](unet_feeds(sample, timestep, context))
        return noise, deep

    def unet_shallow(sample, timestep, context, deep):
        feeds = {**unet_feeds(sample, timestep, context), "deep": deep}
        return runners["unet_shallow"](feeds)[0]

    def decode_latents(latents: np.ndarray):
        return sessions["vae_decoder"].run(None, {"latent": latents})[0]

    deep_cache = None
    if all(name in sessions for name in DEEP_CACHE_MODELS):
        deep_cache = DeepCacheUnets(unet_deep, unet_shallow)
    return Stages(
        analyze_faces,
        optimize_prompt,
        encode_text,
        encode_image,
        unet,
        decode_latents,
        deep_cache,
        analyze_faces_expression,
    )
