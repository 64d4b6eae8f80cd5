"""txt2img: portrait generation from a prompt over the same BLS stages as facefusion."""

import numpy as np

from facefuse.core.contract import IMAGE, INFO, PROMPT
from facefuse.core.limits import check_instruction
from facefuse.diffusion.pipeline import info_json
from facefuse.face.imageio import encode_png
from facefuse.serving.triton_io import bytes_array, get_text, pb_utils, text_tensor
from facefuse.serving.triton_pipeline import PipelineTritonModel


class TritonPythonModel(PipelineTritonModel):
    # every BLS call to a composing model gives up after this many seconds: the request then
    # fails with UNAVAILABLE (HTTP 503) instead of waiting on a hung model (issue 33);
    # a dead or reloading model fails it at once. Config parameter bls_timeout_s overrides.
    BLS_TIMEOUT_S = 60.0

    def handle(self, request):
        pb = pb_utils()
        params = self.params(request, with_strength=False)
        prompt = check_instruction(get_text(request, PROMPT.name), field=PROMPT.name)
        image, info = self.pipeline.txt2img(prompt, params, should_stop=self.should_stop(request))
        png = encode_png((image * 255.0 + 0.5).astype(np.uint8))
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor(IMAGE.name, bytes_array(png)),
                text_tensor(INFO.name, info_json(info)),
            ]
        )
