"""facefusion: the BLS entry point; the orchestration lives in facefuse.diffusion.pipeline."""

from facefuse.core.contract import IMAGE, INFO, INSTRUCTION, SOURCE_IMAGE, TARGET_IMAGE
from facefuse.core.limits import check_instruction
from facefuse.diffusion.pipeline import info_json
from facefuse.serving.triton_io import bytes_array, get_bytes, get_text, pb_utils, text_tensor
from facefuse.serving.triton_pipeline import PipelineTritonModel


class TritonPythonModel(PipelineTritonModel):
    # every BLS call to a composing model gives up after this many seconds: the request then
    # fails with UNAVAILABLE (HTTP 503) instead of waiting on a hung model (issue 33);
    # a dead or reloading model fails it at once. Config parameter bls_timeout_s overrides.
    BLS_TIMEOUT_S = 60.0

    def handle(self, request):
        pb = pb_utils()
        params = self.params(request)
        instruction = check_instruction(get_text(request, INSTRUCTION.name))
        source = get_bytes(request, SOURCE_IMAGE.name)
        png, info = self.pipeline.fuse_png(
            source,
            get_bytes(request, TARGET_IMAGE.name),
            instruction,
            params,
            should_stop=self.should_stop(request),
            auto_steps=self.auto_steps(request),
        )
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor(IMAGE.name, bytes_array(png)),
                text_tensor(INFO.name, info_json(info)),
            ]
        )
