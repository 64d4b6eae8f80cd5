"""facefusion: the BLS entry point; the orchestration lives in facefuse.diffusion.pipeline."""

import time

from facefuse.diffusion.pipeline import info_json
from facefuse.face.fusion import FusionPlan, paste_back
from facefuse.face.imageio import decode_image, encode_png
from facefuse.limits import check_instruction
from facefuse.triton_io import bytes_array, get_bytes, get_text, pb_utils, text_tensor
from facefuse.triton_pipeline import PipelineTritonModel


class TritonPythonModel(PipelineTritonModel):
    def handle(self, request):
        pb = pb_utils()
        params = self.params(request)
        instruction = check_instruction(get_text(request, "INSTRUCTION"))
        source = get_bytes(request, "SOURCE_IMAGE")
        target_bytes = get_bytes(request, "TARGET_IMAGE")
        target = decode_image(target_bytes, "TARGET_IMAGE")
        fused, mask, crop_box, info = self.pipeline.fuse(
            source,
            target_bytes,
            instruction,
            params,
            should_stop=self.should_stop(request),
            auto_steps=self.auto_steps(request),
        )
        started = time.perf_counter()
        plan = FusionPlan.from_arrays(fused, mask, crop_box)
        png = encode_png(paste_back(target, fused, plan))
        info["stage_ms"]["paste_png"] = round(1000 * (time.perf_counter() - started), 2)
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor("IMAGE", bytes_array(png)),
                text_tensor("INFO", info_json(info)),
            ]
        )
