"""unet: noise prediction, batched across concurrent pipelines (ONNX Runtime inside)."""

from facefuse.core.contract import UNET
from facefuse.serving.triton_onnx import LatentOnnxModel


class TritonPythonModel(LatentOnnxModel):
    INPUTS = UNET.input_names
    OUTPUTS = UNET.output_names
