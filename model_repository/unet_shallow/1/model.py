"""unet_shallow: the UNet's shallowest layers on cached deep features (ONNX Runtime inside)."""

from facefuse.core.contract import UNET_SHALLOW
from facefuse.serving.triton_onnx import LatentOnnxModel


class TritonPythonModel(LatentOnnxModel):
    INPUTS = UNET_SHALLOW.input_names
    OUTPUTS = UNET_SHALLOW.output_names
