"""Expression fields through a real tritonserver (issue 30): INFO reports whose expression was
used and the applied edits; out-of-range fields are INVALID_ARG (gRPC) / 400 (HTTP) naming the
field, and the server keeps serving."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from facefuse.client import Client
from tritonclient.utils import InferenceServerException

from facefuse.core import contract as c
from facefuse.face.expression_edit import WARP_GAIN

pytestmark = pytest.mark.integration

FAST = {"steps": 2, "strength": 0.5, "seed": 3}


def _inputs(module, source, target, instruction, **fields):
    tensors = {
        "SOURCE_IMAGE": (np.array([source], dtype=object), "BYTES"),
        "TARGET_IMAGE": (np.array([target], dtype=object), "BYTES"),
        "INSTRUCTION": (np.array([instruction.encode()], dtype=object), "BYTES"),
        "STEPS": (np.array([2], dtype=np.int32), "INT32"),
    }
    for name, value in fields.items():
        if isinstance(value, bytes):
            tensors[name] = (np.array([value], dtype=object), "BYTES")
        elif isinstance(value, str):
            tensors[name] = (np.array([value.encode()], dtype=object), "BYTES")
        else:
            tensors[name] = (np.array([value], dtype=np.float32), "FP32")
    inputs = []
    for name, (array, triton_type) in tensors.items():
        tensor = module.InferInput(name, list(array.shape), triton_type)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _info(module, url, source, target, instruction, **fields):
    import json

    client = module.InferenceServerClient(url)
    try:
        response = client.infer(
            "facefusion", _inputs(module, source, target, instruction, **fields)
        )
        return json.loads(response.as_numpy("INFO").reshape(-1)[0])
    finally:
        client.close()


def test_default_takes_bs_expression_and_info_says_so(server, sample_images):
    source, target = sample_images
    with Client(server.grpc_url, "grpc") as client:
        result = client.fuse(source, target, "make her smile, keep the glasses", **FAST)
    expression = result.info["expression"]
    assert expression["source"] == "target"
    assert expression["landmarks"] == "facemesh-468"
    coefficients = expression["coefficients"]
    assert set(coefficients) == {"source", "target", "applied"}
    assert coefficients["applied"]["smile"] >= 1.0  # the words raise the smile to 1.0
    assert expression["from"]["smile"] == "instruction"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_fields_reach_the_face_stage(server, sample_images, protocol):
    source, target = sample_images
    module = grpcclient if protocol == "grpc" else httpclient
    url = server.grpc_url if protocol == "grpc" else server.http_url
    info = _info(
        module, url, source, target, "keep a neutral expression",
        EXPRESSION_SOURCE="source", EXPRESSION_SMILE=0.5, EXPRESSION_MOUTH_OPEN=0.25,
    )  # fmt: skip
    expression = info["expression"]
    assert expression["source"] == "source"
    assert expression["smile"] == 0.5 and expression["mouth_open"] == 0.25
    assert expression["from"] == {"smile": "request", "mouth_open": "request"}
    applied, own = expression["coefficients"]["applied"], expression["coefficients"]["source"]
    # the increase is multiplied by the warp's gain; face-shape modes stay A's own
    assert applied["smile"] == pytest.approx(own["smile"] + 0.5 * WARP_GAIN, abs=2e-3)
    assert applied["mode1"] == own["mode1"] and applied["mode2"] == own["mode2"]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_out_of_range_fields_are_invalid_argument_naming_the_field(server, sample_images, protocol):
    source, target = sample_images
    module = grpcclient if protocol == "grpc" else httpclient
    url = server.grpc_url if protocol == "grpc" else server.http_url
    expected = "StatusCode.INVALID_ARGUMENT" if protocol == "grpc" else "400"
    client = module.InferenceServerClient(url)
    try:
        for field, value in (
            (c.EXPRESSION_SMILE.name, 2.5),
            (c.EXPRESSION_SMILE.name, float("nan")),
            (c.EXPRESSION_MOUTH_OPEN.name, -0.5),
            (c.EXPRESSION_MOUTH_OPEN.name, 1.5),
            (c.EXPRESSION_SOURCE.name, "both"),
        ):
            with pytest.raises(InferenceServerException) as caught:
                client.infer(
                    "facefusion", _inputs(module, source, target, "smile", **{field: value})
                )
            message = caught.value.message()
            assert str(caught.value.status()) == expected, (field, message)
            assert field in message and "Traceback" not in message, message
        response = client.infer("facefusion", _inputs(module, source, target, "smile"))
        assert response.as_numpy("IMAGE").reshape(-1)[0][:4] == b"\x89PNG"
    finally:
        client.close()


def _png(array: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def test_several_faces_largest_all_and_reference(server, sample_images):
    import io

    from PIL import Image

    source, target = sample_images
    one = np.asarray(Image.open(io.BytesIO(target)).convert("RGB"))
    two = _png(np.concatenate([one, one[:, ::-1]], axis=1))  # B and its mirror image
    info = _info(grpcclient, server.grpc_url, source, two, "portrait")
    faces = info["faces"]
    assert faces["found"] == 2 and faces["select"] == "largest" and len(faces["fused"]) == 1
    info = _info(grpcclient, server.grpc_url, source, two, "portrait", FACE_SELECT="all")
    assert info["faces"]["fused"] == [0, 1] and len(info["faces"]["each"]) == 2
    info = _info(grpcclient, server.grpc_url, source, two, "portrait", REFERENCE_FACE=target)
    assert info["faces"]["select"] == "reference" and len(info["faces"]["reference_distances"]) == 2


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bad_face_selection_is_invalid_argument_naming_the_field(server, sample_images, protocol):
    source, target = sample_images
    module = grpcclient if protocol == "grpc" else httpclient
    url = server.grpc_url if protocol == "grpc" else server.http_url
    expected = "StatusCode.INVALID_ARGUMENT" if protocol == "grpc" else "400"
    flat = _png(np.full((128, 128, 3), 90, dtype=np.uint8))
    client = module.InferenceServerClient(url)
    try:
        for fields, field in (
            ({"REFERENCE_FACE": flat}, "REFERENCE_FACE"),  # a reference with no face
            ({"FACE_SELECT": "tallest"}, "FACE_SELECT"),
            ({"FACE_SELECT": "reference"}, "REFERENCE_FACE"),  # reference without a photo
        ):
            with pytest.raises(InferenceServerException) as caught:
                client.infer("facefusion", _inputs(module, source, target, "smile", **fields))
            message = caught.value.message()
            assert str(caught.value.status()) == expected, (field, message)
            assert field in message and "Traceback" not in message, message
    finally:
        client.close()
