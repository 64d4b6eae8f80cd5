"""unet_deep: the whole UNet, also returning DeepCache's deep features (ONNX Runtime inside)."""

from facefuse.core.contract import UNET_DEEP
from facefuse.serving.triton_onnx import LatentOnnxModel


class TritonPythonModel(LatentOnnxModel):
    INPUTS = UNET_DEEP.input_names
    OUTPUTS = UNET_DEEP.output_names
