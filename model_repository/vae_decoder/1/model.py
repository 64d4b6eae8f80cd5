"""vae_decoder: scaled latents -> pixels in [-1, 1] (ONNX Runtime inside, batched)."""

from facefuse.triton_onnx import OnnxTritonModel


class TritonPythonModel(OnnxTritonModel):
    INPUTS = ("latent",)
    OUTPUTS = ("image",)
    SIDE_SCALE = 8  # latents
