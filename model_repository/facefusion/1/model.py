"""facefusion: the BLS entry point; the orchestration lives in facefuse.diffusion.pipeline."""

from facefuse.core.contract import (
    EXPRESSION_MOUTH_OPEN,
    EXPRESSION_SMILE,
    EXPRESSION_SOURCE,
    FACE_SELECT,
    IMAGE,
    INFO,
    INSTRUCTION,
    REFERENCE_FACE,
    SOURCE_IMAGE,
    TARGET_IMAGE,
    check_expression_inputs,
    check_face_select,
)
from facefuse.core.errors import InvalidInput
from facefuse.core.limits import check_fusion_instruction
from facefuse.diffusion.pipeline import info_json
from facefuse.serving.triton_io import (
    bytes_array,
    get_bytes,
    get_scalar,
    get_text,
    pb_utils,
    text_tensor,
)
from facefuse.serving.triton_pipeline import PipelineTritonModel


def _number(name: str):
    def cast(value):
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):
            raise InvalidInput(name, f"must be a number, got {value!r}") from None

    return cast


def expression_fields(request) -> dict:
    """The request's expression fields as ExpressionEdit keywords (absent ones left out),
    validated: InvalidInput names the field."""
    source = get_text(request, EXPRESSION_SOURCE.name, required=False)
    smile = get_scalar(request, EXPRESSION_SMILE.name, None, _number(EXPRESSION_SMILE.name))
    mouth = get_scalar(
        request, EXPRESSION_MOUTH_OPEN.name, None, _number(EXPRESSION_MOUTH_OPEN.name)
    )
    source = source.strip().lower() if source is not None else None
    check_expression_inputs(source, smile, mouth)
    fields = {"source": source, "smile": smile, "mouth_open": mouth}
    return {k: v for k, v in fields.items() if v is not None}


class TritonPythonModel(PipelineTritonModel):
    def handle(self, request):
        pb = pb_utils()
        params = self.params(request)
        instruction = check_fusion_instruction(get_text(request, INSTRUCTION.name))
        expression = expression_fields(request)
        reference = get_bytes(request, REFERENCE_FACE.name, required=False)
        select = get_text(request, FACE_SELECT.name, required=False)
        select = select.strip().lower() if select is not None else None
        expression["face_select"] = check_face_select(select, reference is not None)
        source = get_bytes(request, SOURCE_IMAGE.name)
        png, info = self.pipeline.fuse_png(
            source,
            get_bytes(request, TARGET_IMAGE.name),
            instruction,
            params,
            should_stop=self.should_stop(request),
            auto_steps=self.auto_steps(request),
            expression=expression,
            reference=reference,
        )
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor(IMAGE.name, bytes_array(png)),
                text_tensor(INFO.name, info_json(info)),
            ]
        )
