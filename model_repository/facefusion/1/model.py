"""facefusion: the BLS entry point; the orchestration lives in facefuse.diffusion.pipeline."""

from facefuse.diffusion.pipeline import info_json
from facefuse.limits import check_instruction
from facefuse.triton_io import bytes_array, get_bytes, get_text, pb_utils, text_tensor
from facefuse.triton_pipeline import PipelineTritonModel


class TritonPythonModel(PipelineTritonModel):
    def handle(self, request):
        pb = pb_utils()
        params = self.params(request)
        instruction = check_instruction(get_text(request, "INSTRUCTION"))
        source = get_bytes(request, "SOURCE_IMAGE")
        png, info = self.pipeline.fuse_png(
            source,
            get_bytes(request, "TARGET_IMAGE"),
            instruction,
            params,
            should_stop=self.should_stop(request),
            auto_steps=self.auto_steps(request),
        )
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor("IMAGE", bytes_array(png)),
                text_tensor("INFO", info_json(info)),
            ]
        )
