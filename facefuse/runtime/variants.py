"""Precision variants of the ONNX models, their file names, and the A/B request router.

A repository holds the variants of one model side by side in the same version folder::

    REPO/unet/1/model.onnx         fp32 (the reference, always present)
    REPO/unet/1/model.int8.onnx    CPU: attention fused, dynamic INT8 of MatMul/Gemm weights
    REPO/unet/1/model.fp16.onnx    FP16 weights, fp32 inputs/outputs (GPU)
    REPO/unet/1/model.plan         TensorRT engine (GPU, built on the target host)

Which file a Python-backend model serves is its config parameter ``onnx_file``. A variant
touches only the models in :data:`VARIANT_MODELS`; the others keep ``model.onnx``. For A/B
routing ``facefuse export`` generates sibling model folders (``unet_int8``, ...) whose config
points at the variant file of the base model (no copy of the weights).

numpy-free and torch-free: the serving processes import this.
"""

from __future__ import annotations

PRECISIONS = ("fp32", "int8", "fp16")
TARGETS = ("cpu", "gpu")
REFERENCE = "fp32"

ONNX_MODELS = ("text_encoder", "unet", "unet_deep", "unet_shallow", "vae_encoder", "vae_decoder")
# the DeepCache pair (facefuse.models.deepcache): CPU only, served beside ``unet``
DEEP_CACHE_MODELS = ("unet_deep", "unet_shallow")

# INT8 (dynamic, MatMul/Gemm only): the UNet is ~90% of the compute; the VAEs are
# convolution-bound (quantised convolutions made the SD-1.5 UNet 2x slower on ORT CPU) and the
# text encoder is served through the prefix-KV cache, so only the UNet (and its DeepCache pair)
# gets an INT8 file.
# FP16 (GPU): every graph that a native GPU backend serves.
VARIANT_MODELS: dict[str, tuple[str, ...]] = {
    "fp32": ("unet", "vae_encoder", "vae_decoder"),  # the FP32 fallback models on GPU
    "int8": ("unet", *DEEP_CACHE_MODELS),
    "fp16": ("unet", "vae_encoder", "vae_decoder"),
}


def onnx_file(precision: str) -> str:
    """File name of ``precision`` inside a version folder: model.onnx, model.int8.onnx, ..."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return "model.onnx" if precision == REFERENCE else f"model.{precision}.onnx"


def variant_files(precision: str) -> dict[str, str]:
    """For each ONNX model, the file that variant ``precision`` serves."""
    touched = VARIANT_MODELS[precision] if precision in VARIANT_MODELS else ()
    onnx_file(precision)  # validates the name
    return {m: onnx_file(precision) if m in touched else "model.onnx" for m in ONNX_MODELS}


def variant_model_name(model: str, precision: str) -> str:
    """Triton model name serving ``precision`` of ``model`` for A/B routing and fallback."""
    return f"{model}_{precision}"


def variant_model_names(precision: str | None) -> dict[str, str]:
    """Triton model names a pipeline calls for ``precision`` (None = the base models)."""
    touched = () if precision is None else VARIANT_MODELS[precision]
    return {m: variant_model_name(m, precision) if m in touched else m for m in ONNX_MODELS}


class ABRouter:
    """Sends an exact share of requests to the candidate, evenly spread, deterministically.

    Request ``n`` (0-based) goes to the candidate iff ``floor((n+1)*share) > floor(n*share)``:
    after any ``N`` requests the candidate has run ``floor(N*share)`` of them, so the measured
    split equals the configured one without randomness (and tests can check it exactly).
    """

    def __init__(self, share: float):
        share = float(share)
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"candidate share must be in [0, 1], got {share}")
        self.share = share
        self.count = 0

    def next_is_candidate(self) -> bool:
        n = self.count
        self.count += 1
        return int((n + 1) * self.share + 1e-9) > int(n * self.share + 1e-9)


class VariantRoutes:
    """Per request: which variant runs and which Triton models its stages call.

    ``served`` is the variant the base models (``unet``, ``vae_*``) serve (config parameter
    ``precision``: fp32 on CPU by default, fp16 with the GPU configs). A ``share`` of requests
    runs ``candidate`` instead, on its generated ``<model>_<candidate>`` models. ``current``
    (the fallback controller's variant) differs from ``served`` after an FP32 fallback: then
    every request runs on the ``<model>_fp32`` models.
    """

    def __init__(self, served: str, candidate: str | None = None, share: float = 0.0):
        for name in (served, candidate):
            if name is not None and name not in PRECISIONS:
                raise ValueError(f"variant must be one of {PRECISIONS}, got {name!r}")
        if candidate == served:
            candidate = None
        self.served = served
        self.candidate = candidate
        self.router = ABRouter(share if candidate else 0.0)

    def pick(self, current: str | None = None) -> tuple[str, dict[str, str]]:
        """(variant label, model names) for the next request."""
        if current is not None and current != self.served:
            return current, variant_model_names(current)
        if self.candidate is not None and self.router.next_is_candidate():
            return self.candidate, variant_model_names(self.candidate)
        return self.served, variant_model_names(None)
