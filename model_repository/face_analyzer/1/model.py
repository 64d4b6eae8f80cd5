"""face_analyzer: thin adapter over facefuse.face (detect, align, expression, mask, composite)."""

import json

import numpy as np

from facefuse.core.contract import (
    COMPOSITE,
    CROP_BOX,
    EXPRESSION,
    INFO,
    MASK,
    REFERENCE_FACE,
    SIZE,
    SOURCE_IMAGE,
    TARGET_IMAGE,
)
from facefuse.core.errors import InvalidInput, ModelLoadError
from facefuse.face.expression import default_model as expression_model
from facefuse.face.expression_edit import ExpressionEdit
from facefuse.face.facemesh import session as facemesh_session
from facefuse.face.fusion import prepare_fusion, warm_up
from facefuse.face.imageio import decode_image
from facefuse.face.mask import FEATHER
from facefuse.serving.triton_io import (
    exit_with_parent,
    get_bytes,
    get_scalar,
    pb_utils,
    respond_each,
    text_tensor,
)

MIN_SIZE, MAX_SIZE = 64, 2048


def _expression(request) -> ExpressionEdit | None:
    """The EXPRESSION input (JSON from the facefusion pipeline), or None: A's face as it is."""
    raw = get_bytes(request, EXPRESSION.name, required=False)
    if raw is None:
        return None
    try:
        return ExpressionEdit.from_json(raw)
    except InvalidInput:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidInput(EXPRESSION.name, f"must be an expression edit as JSON: {exc}") from None


class TritonPythonModel:
    def initialize(self, args):
        exit_with_parent()
        config = json.loads(args["model_config"])
        self.name = config["name"]
        raw = config.get("parameters", {}).get("feather", {}).get("string_value", str(FEATHER))
        self.feather = float(raw)
        if not 0.0 < self.feather < 1.0:
            raise ModelLoadError(f"{self.name}: parameter feather must be in (0, 1), got {raw!r}")
        warm_up()  # build the detectors now, not on the first request
        facemesh_session()  # and the landmark network and expression basis
        expression_model()

    def _handle(self, request):
        pb = pb_utils()
        size = get_scalar(request, SIZE.name, None, int)
        if size is None or not (MIN_SIZE <= size <= MAX_SIZE) or size % 8:
            raise InvalidInput(SIZE.name, f"must be a multiple of 8 in {MIN_SIZE}..{MAX_SIZE}")
        expression = _expression(request)
        source = decode_image(get_bytes(request, SOURCE_IMAGE.name), SOURCE_IMAGE.name)
        target = decode_image(get_bytes(request, TARGET_IMAGE.name), TARGET_IMAGE.name)
        reference = get_bytes(request, REFERENCE_FACE.name, required=False)
        if reference is not None:
            reference = decode_image(reference, REFERENCE_FACE.name)
        plan = prepare_fusion(
            source,
            target,
            size,
            feather=self.feather,
            expression=expression,
            reference_rgb=reference,
        )
        composite, mask, crop_box = plan.to_arrays()
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor(COMPOSITE.name, np.ascontiguousarray(composite, dtype=np.float32)),
                pb.Tensor(MASK.name, np.ascontiguousarray(mask, dtype=np.float32)),
                pb.Tensor(CROP_BOX.name, np.asarray(crop_box, dtype=np.int64)),
                text_tensor(INFO.name, json.dumps(plan.info or {}, sort_keys=True)),
            ]
        )

    def execute(self, requests):
        return respond_each(requests, self._handle, self.name)
