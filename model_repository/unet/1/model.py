"""unet: noise prediction, batched across concurrent pipelines (ONNX Runtime inside)."""

from facefuse.triton_onnx import OnnxTritonModel


class TritonPythonModel(OnnxTritonModel):
    INPUTS = ("sample", "timestep", "encoder_hidden_states")
    OUTPUTS = ("noise_pred",)
    FLATTEN = ("timestep",)  # [B, 1] in Triton, [B] in the graph
    SPATIAL_MULTIPLE = 8  # three down-samplings in SD 1.x
    SIDE_SCALE = 8  # latents
