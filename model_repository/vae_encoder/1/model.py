"""vae_encoder: pixels in [-1, 1] -> scaled latents (ONNX Runtime inside, batched)."""

from facefuse.core.contract import VAE_ENCODER
from facefuse.serving.triton_onnx import OnnxTritonModel


class TritonPythonModel(OnnxTritonModel):
    INPUTS = VAE_ENCODER.input_names
    OUTPUTS = VAE_ENCODER.output_names
    SPATIAL_MULTIPLE = 8  # the VAE down-samples by 8
