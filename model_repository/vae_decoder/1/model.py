"""vae_decoder: scaled latents -> pixels in [-1, 1] (ONNX Runtime inside, batched)."""

from facefuse.core.contract import VAE_DECODER
from facefuse.serving.triton_onnx import OnnxTritonModel


class TritonPythonModel(OnnxTritonModel):
    INPUTS = VAE_DECODER.input_names
    OUTPUTS = VAE_DECODER.output_names
    SIDE_SCALE = 8  # latents
