"""vae_encoder: pixels in [-1, 1] -> scaled latents (ONNX Runtime inside, batched)."""

from facefuse.triton_onnx import OnnxTritonModel


class TritonPythonModel(OnnxTritonModel):
    INPUTS = ("image",)
    OUTPUTS = ("latent",)
    SPATIAL_MULTIPLE = 8  # the VAE down-samples by 8
