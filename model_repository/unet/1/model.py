"""unet: noise prediction, batched across concurrent pipelines (ONNX Runtime inside)."""

from facefuse.core.contract import TIMESTEP, UNET
from facefuse.serving.triton_onnx import OnnxTritonModel


class TritonPythonModel(OnnxTritonModel):
    INPUTS = UNET.input_names
    OUTPUTS = UNET.output_names
    FLATTEN = (TIMESTEP.name,)  # [B, 1] in Triton, [B] in the graph
    SPATIAL_MULTIPLE = 8  # three down-samplings in SD 1.x
    SIDE_SCALE = 8  # latents
