"""Hypothesis fuzzing of a real tritonserver: hostile bytes, shapes, dtypes, text and numbers.

Every response must be a success or a clean client error: HTTP 400/404, gRPC
INVALID_ARGUMENT/NOT_FOUND, with no traceback in the message. A 500/INTERNAL is a bug (an
input check missing in the library), never an accepted outcome. After each fuzz run the
server must still answer a valid face-fusion request. Valid-looking diffusion requests use
STEPS 1..2 so the whole module stays within a few minutes on 2 cores.

The number of cases sent is printed at the end of the module (see docs/reliability.md).
"""

from __future__ import annotations

import io
import json
import os
import urllib.error
import urllib.request
from collections import Counter

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

pytestmark = pytest.mark.integration

CLEAN = {"400", "404", "StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND"}


def fuzz(max_examples: int) -> settings:
    """Bounded: no deadline per example (a valid request runs a pipeline), no example store.

    Under CI (``CI=true``) the examples are derandomised, so a landing is judged on the same
    cases every run; locally every run draws new ones."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=os.environ.get("CI", "").lower() == "true",
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


CASES: Counter = Counter()
FRONTEND_500: Counter = Counter()


@pytest.fixture(scope="module")
def clients(server, request):
    made = {
        "http": httpclient.InferenceServerClient(server.http_url, network_timeout=300),
        "grpc": grpcclient.InferenceServerClient(server.grpc_url),
    }
    yield made
    for client in made.values():
        client.close()
    total = sum(CASES.values())
    detail = ", ".join(f"{name} {n}" for name, n in sorted(CASES.items()))
    line = f"fuzz: {total} cases sent to the server ({detail})"
    if FRONTEND_500:
        line += f"; {sum(FRONTEND_500.values())} malformed JSON bodies got tritonserver's 500"
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n{line}")


def tensor(protocol: str, name: str, array: np.ndarray, datatype: str | None = None):
    module = httpclient if protocol == "http" else grpcclient
    array = np.asarray(array)
    if datatype is None:
        datatype = "BYTES" if array.dtype == object else np_to_triton_dtype(array.dtype)
    item = module.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array)
    return item


def text(value: bytes | str) -> np.ndarray:
    return np.array([value.encode() if isinstance(value, str) else value], dtype=object)


def send(clients, protocol: str, model: str, arrays: dict, kind: str):
    """Send one request; return 'ok' or the clean error status. Fails on anything else."""
    CASES[kind] += 1
    inputs = [tensor(protocol, name, *spec) for name, spec in arrays.items()]
    try:
        clients[protocol].infer(model, inputs)
        return "ok"
    except InferenceServerException as exc:
        status, message = str(exc.status()), exc.message() or ""
        assert status in CLEAN, f"{model} {protocol}: {status}: {message[:500]}"
        assert "Traceback" not in message, message
        return status


def fusion_arrays(source: bytes, target: bytes, instruction="make her smile", **scalars):
    arrays = {
        "SOURCE_IMAGE": (text(source),),
        "TARGET_IMAGE": (text(target),),
        "INSTRUCTION": (text(instruction),),
        "STEPS": (np.array([scalars.pop("STEPS", 1)], dtype=np.int32),),
    }
    for name, value in scalars.items():
        arrays[name] = (np.asarray([value], dtype=np.int64 if name == "SEED" else np.float32),)
    return arrays


def assert_still_serving(clients, sample_images):
    source, target = sample_images
    for protocol in ("http", "grpc"):
        inputs = fusion_arrays(source, target, STEPS=1, STRENGTH=0.5)
        response = clients[protocol].infer(
            "facefusion", [tensor(protocol, n, *s) for n, s in inputs.items()]
        )
        png = response.as_numpy("IMAGE").reshape(-1)[0]
        assert Image.open(io.BytesIO(png)).format == "PNG"


# ---------------------------------------------------------------- image bytes


def _jpeg_of(png: bytes) -> bytes:
    buffer = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").save(buffer, format="JPEG", quality=80)
    return buffer.getvalue()


@st.composite
def mutated_image(draw, originals: tuple[bytes, ...]):
    data = bytearray(draw(st.sampled_from(originals)))
    how = draw(st.sampled_from(["flip", "truncate", "splice", "header", "random", "repeat"]))
    if how == "flip":
        for _ in range(draw(st.integers(1, 16))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
    elif how == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif how == "splice":
        i = draw(st.integers(0, len(data)))
        data[i:i] = draw(st.binary(min_size=1, max_size=64))
    elif how == "header":  # damage the first bytes, where sizes and magic numbers live
        i = draw(st.integers(0, min(64, len(data) - 1)))
        data[i : i + 4] = draw(st.binary(min_size=4, max_size=4))
    elif how == "random":
        data = bytearray(draw(st.binary(min_size=0, max_size=2048)))
    else:  # a valid magic number followed by junk
        data = data[:16] + bytearray(draw(st.binary(min_size=0, max_size=512)))
    return bytes(data)


def test_fuzz_image_bytes_face_analyzer(server, clients, sample_images):
    source, target = sample_images
    originals = (source, target, _jpeg_of(target))

    @fuzz(100)
    @given(
        image=mutated_image(originals),
        which=st.sampled_from(["SOURCE_IMAGE", "TARGET_IMAGE"]),
        protocol=st.sampled_from(["http", "grpc"]),
    )
    def run(image, which, protocol):
        arrays = {"SOURCE_IMAGE": (text(source),), "TARGET_IMAGE": (text(target),)}
        arrays[which] = (text(image),)
        arrays["SIZE"] = (np.array([256], dtype=np.int32),)
        send(clients, protocol, "face_analyzer", arrays, "image_bytes")

    run()
    assert_still_serving(clients, sample_images)


def test_fuzz_image_bytes_facefusion(server, clients, sample_images):
    source, target = sample_images
    originals = (source, _jpeg_of(target))

    @fuzz(12)
    @given(image=mutated_image(originals), as_source=st.booleans())
    def run(image, as_source):
        pair = (image, target) if as_source else (source, image)
        send(clients, "http", "facefusion", fusion_arrays(*pair, STEPS=1), "image_bytes")

    run()
    assert_still_serving(clients, sample_images)


# ---------------------------------------------------------------- text

hostile_text = st.one_of(
    st.text(max_size=80),
    st.text(alphabet=st.characters(max_codepoint=0x1F), max_size=20),  # control characters
    st.text(alphabet=st.characters(categories=["Cf", "Mn", "Zs", "So", "Co"]), max_size=40),
    st.sampled_from(["", " ", "\u202e smile", "a\x00b", "smile" * 500, "😀" * 50, "\ufeffsmile"]),
)
hostile_bytes = st.one_of(
    hostile_text.map(lambda s: s.encode("utf-8")),
    st.binary(max_size=80),  # mostly invalid UTF-8
    st.sampled_from([b"\xff\xfe", b"\xed\xa0\x80", b"smile \xc0\xaf", b"x" * 10_000]),
)


def test_fuzz_text_prompt_optimizer(server, clients):
    @fuzz(150)
    @given(
        instruction=hostile_bytes,
        negative=st.none() | hostile_bytes,
        overflow=st.none() | st.sampled_from([b"truncate", b"chunk"]) | hostile_bytes,
        protocol=st.sampled_from(["http", "grpc"]),
    )
    def run(instruction, negative, overflow, protocol):
        arrays = {"INSTRUCTION": (text(instruction),)}
        if negative is not None:
            arrays["NEGATIVE_PROMPT"] = (text(negative),)
        if overflow is not None:
            arrays["OVERFLOW"] = (text(overflow),)
        send(clients, protocol, "prompt_optimizer", arrays, "text")

    run()


def test_fuzz_text_pipelines(server, clients, sample_images):
    source, target = sample_images

    @fuzz(16)
    @given(value=hostile_bytes, model=st.sampled_from(["txt2img", "facefusion"]))
    def run(value, model):
        if model == "txt2img":
            arrays = {"PROMPT": (text(value),), "STEPS": (np.array([1], dtype=np.int32),)}
        else:
            arrays = fusion_arrays(source, target, value, STEPS=1)
        send(clients, "http", model, arrays, "text")

    run()
    assert_still_serving(clients, sample_images)


# ---------------------------------------------------------------- numbers

special_floats = st.one_of(
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e38, -1e38, 1e-45]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.floats(min_value=0.05, max_value=1.0),
)
steps_values = st.sampled_from([-(2**31), -1, 0, 1, 2, 101, 2**31 - 1])
seed_values = st.sampled_from([-(2**63), -1, 0, 1, 2**62, 2**63 - 1]) | st.integers(0, 2**63 - 1)


def test_fuzz_parameters(server, clients, sample_images):
    source, target = sample_images

    @fuzz(30)
    @given(
        model=st.sampled_from(["txt2img", "facefusion"]),
        steps=steps_values,
        strength=special_floats,
        guidance=special_floats | st.floats(1.0, 30.0),
        seed=seed_values,
        protocol=st.sampled_from(["http", "grpc"]),
    )
    def run(model, steps, strength, guidance, seed, protocol):
        scalars = {
            "STEPS": (np.array([steps], dtype=np.int32),),
            "GUIDANCE": (np.array([guidance], dtype=np.float32),),
            "SEED": (np.array([seed], dtype=np.int64),),
        }
        if model == "txt2img":
            arrays = {"PROMPT": (text("portrait of a woman"),), **scalars}
        else:
            arrays = fusion_arrays(source, target)
            arrays.update(scalars, STRENGTH=(np.array([strength], dtype=np.float32),))
        send(clients, protocol, model, arrays, "parameters")

    run()
    assert_still_serving(clients, sample_images)


# ---------------------------------------------------------------- raw tensors

COMPONENTS = {
    # model: {input: (rank, typical dims)}
    "unet": {"sample": (4, 4), "timestep": (2, 1), "encoder_hidden_states": (3, 64)},
    "vae_encoder": {"image": (4, 3)},
    "vae_decoder": {"latent": (4, 4)},
    "text_encoder": {"INPUT_IDS": (2, 77)},
    "face_analyzer": {"SOURCE_IMAGE": (1, 1), "TARGET_IMAGE": (1, 1), "SIZE": (1, 1)},
    "prompt_optimizer": {"INSTRUCTION": (1, 1)},
}
DTYPES = [np.float32, np.float16, np.float64, np.int64, np.int32, np.uint8, np.bool_, object]
MAX_ELEMENTS = 2 * 4 * 64 * 64


@st.composite
def raw_tensor(draw, rank: int, typical: int):
    """A shape near the expected one (often exactly plausible), any dtype, hostile values."""
    if draw(st.booleans()):
        rank = draw(st.integers(0, 5))
    dims = []
    for axis in range(rank):
        choices = [st.integers(0, 9), st.sampled_from([8, 16, 32, 64, 77]), st.just(typical)]
        if axis == 0:
            choices.append(st.integers(1, 3))
        dims.append(draw(st.one_of(*choices)))
    while int(np.prod(dims, dtype=np.int64)) > MAX_ELEMENTS:
        dims[int(np.argmax(dims))] //= 2
    dtype = draw(st.sampled_from(DTYPES[:1] * 4 + DTYPES))  # mostly the right one (FP32)
    size = int(np.prod(dims, dtype=np.int64))
    if dtype is object:
        values = [draw(st.binary(max_size=8)) for _ in range(min(size, 4))]
        array = np.array((values * size)[:size] or [b""] * size, dtype=object).reshape(dims)
    elif dtype is np.bool_:
        array = np.zeros(dims, dtype=np.bool_)
    else:
        fill = draw(
            st.sampled_from(["zeros", "normal", "nan", "inf", "huge", "ids"])
            if np.issubdtype(dtype, np.floating)
            else st.sampled_from(["zeros", "ids", "negative", "huge"])
        )
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        base = {
            "zeros": np.zeros(dims),
            "normal": rng.standard_normal(dims),
            "nan": np.full(dims, np.nan),
            "inf": np.full(dims, np.inf),
            "huge": np.full(dims, 3e38 if np.issubdtype(dtype, np.floating) else 2**30),
            "ids": rng.integers(0, 49408, dims),
            "negative": -rng.integers(1, 1000, dims),
        }[fill]
        with np.errstate(all="ignore"):
            array = base.astype(dtype)
    return array


def test_fuzz_component_tensors(server, clients, sample_images):
    @fuzz(250)
    @given(data=st.data(), protocol=st.sampled_from(["http", "grpc"]))
    def run(data, protocol):
        model = data.draw(st.sampled_from(sorted(COMPONENTS)))
        arrays = {}
        for name, (rank, typical) in COMPONENTS[model].items():
            if data.draw(st.integers(0, 9)) == 0:
                continue  # a missing input
            arrays[name] = (data.draw(raw_tensor(rank, typical)),)
        if data.draw(st.integers(0, 9)) == 0:
            arrays["UNKNOWN_INPUT"] = (np.zeros((1,), dtype=np.float32),)
        if not arrays:
            arrays["sample"] = (np.zeros((1, 4, 8, 8), dtype=np.float32),)
        send(clients, protocol, model, arrays, "tensors")

    run()
    assert_still_serving(clients, sample_images)


def test_plausible_component_tensors_succeed(server, clients):
    """The checks that refuse hostile shapes still let the shapes the pipeline sends through."""
    rng = np.random.default_rng(0)
    ok = {
        "unet": {
            "sample": (rng.standard_normal((2, 4, 32, 32)).astype(np.float32),),
            "timestep": (np.full((2, 1), 500.0, dtype=np.float32),),
            "encoder_hidden_states": (rng.standard_normal((2, 77, 64)).astype(np.float32),),
        },
        "vae_encoder": {"image": (rng.uniform(-1, 1, (1, 3, 256, 256)).astype(np.float32),)},
        "vae_decoder": {"latent": (rng.standard_normal((1, 4, 32, 32)).astype(np.float32),)},
        "text_encoder": {"INPUT_IDS": (np.full((2, 77), 49407, dtype=np.int64),)},
    }
    for model, arrays in ok.items():
        for protocol in ("http", "grpc"):
            assert send(clients, protocol, model, arrays, "plausible") == "ok", model
    unet = dict(ok["unet"], sample=(np.zeros((2, 4, 30, 30), dtype=np.float32),))
    assert send(clients, "http", "unet", unet, "plausible") == "400"  # refused, not a 500


# ---------------------------------------------------------------- raw HTTP/JSON bodies

# tritonserver 2.51's HTTP frontend answers a body that is not a JSON object with an "inputs"
# array (or whose parameter names it cannot read) with 500 and one of these one-line messages,
# before any model runs; nothing in the model repository can change that (a reverse proxy can
# validate JSON first). Any other 500 fails the test.
FRONTEND_JSON_ERRORS = (
    '{"error":"failed to parse the request JSON buffer:',
    '{"error":"Unable to parse \'',
    '{"error":"failed to get request params.: attempt to',
    '{"error":"Unable to parse JSON bytes array:',
    # a "parameters" key holding a NUL character: the frontend's JSON reader cuts the key at it
    '{"error":"parameter key \'',
)
MODELS = ["facefusion", "txt2img", "face_analyzer", "prompt_optimizer", "unet", "text_encoder"]


@st.composite
def json_body(draw):
    """A KServe v2 JSON body with hostile structure: wrong types, lengths, names, shapes."""
    junk = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=8,
    )
    inputs = []
    for _ in range(draw(st.integers(0, 3))):
        item = {
            "name": draw(st.sampled_from(["INSTRUCTION", "STEPS", "sample", "PROMPT", "x"])),
            "shape": draw(st.lists(st.integers(-2, 5), max_size=4)),
            "datatype": draw(st.sampled_from(["BYTES", "FP32", "INT32", "INT64", "FP99", ""])),
            "data": draw(st.lists(st.integers() | st.floats() | st.text(max_size=8), max_size=6)),
        }
        if draw(st.booleans()):
            item[draw(st.text(max_size=6))] = draw(junk)
        inputs.append(item)
    body = {"inputs": inputs}
    if draw(st.booleans()):
        body["parameters"] = draw(junk)
    raw = json.dumps(body).encode()
    if draw(st.integers(0, 3)) == 0:  # broken JSON
        cut = draw(st.integers(0, len(raw)))
        raw = raw[:cut] + draw(st.binary(max_size=8))
    return raw


def test_fuzz_raw_http_json(server, clients, sample_images):
    @fuzz(120)
    @given(
        body=json_body(),
        model=st.sampled_from([*MODELS, "no_such_model", "../etc/passwd", "facefusion/versions/9"]),
        header_length=st.none() | st.integers(-5, 10_000),
    )
    def run(body, model, header_length):
        CASES["http_json"] += 1
        url = f"http://{server.http_url}/v2/models/{urllib.request.quote(model)}/infer"
        request = urllib.request.Request(url, data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        if header_length is not None:
            request.add_header("Inference-Header-Content-Length", str(header_length))
        message = ""
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
            message = exc.read().decode(errors="replace")
            assert "Traceback" not in message
        if status == 500 and message.startswith(FRONTEND_JSON_ERRORS):
            FRONTEND_500[model] += 1  # tritonserver's own JSON parser, see FRONTEND_JSON_ERRORS
            return
        assert status in (200, 400, 404), (status, model, body[:200], message[:300])

    run()
    assert_still_serving(clients, sample_images)


# ---------------------------------------------------------------- INFO never echoes input


def test_info_and_errors_never_echo_input_bytes(server, clients, sample_images):
    """Marker bytes hidden in the images (PNG text chunk, JPEG comment, trailing bytes) never
    come back: not in INFO, not in an error message, not in the server log."""
    from PIL import PngImagePlugin

    source, target = sample_images
    marker = "QXJ7-SECRET-IMAGE-BYTES-9KZ"
    meta = PngImagePlugin.PngInfo()
    meta.add_text("Comment", marker)
    buffer = io.BytesIO()
    Image.open(io.BytesIO(target)).save(buffer, format="PNG", pnginfo=meta)
    marked_target = buffer.getvalue() + marker.encode()
    buffer = io.BytesIO()
    Image.open(io.BytesIO(source)).save(buffer, format="JPEG", comment=marker.encode())
    marked_source = buffer.getvalue()
    assert marker.encode() in marked_target and marker.encode() in marked_source
    inputs = fusion_arrays(marked_source, marked_target, STEPS=1)
    response = clients["http"].infer(
        "facefusion", [tensor("http", n, *s) for n, s in inputs.items()]
    )
    info = response.as_numpy("INFO").reshape(-1)[0].decode()
    assert marker not in info and len(info) < 4000
    assert set(json.loads(info)) >= {"steps", "stage_ms", "tokens_before", "tokens_after"}
    broken = marked_target[:200] + marker.encode() * 3  # undecodable, marker inside
    for protocol in ("http", "grpc"):
        status = send(clients, protocol, "facefusion", fusion_arrays(source, broken), "image_bytes")
        assert status in CLEAN
        try:
            clients[protocol].infer(
                "facefusion",
                [tensor(protocol, n, *s) for n, s in fusion_arrays(source, broken).items()],
            )
        except InferenceServerException as exc:
            assert marker not in (exc.message() or "")
    assert marker not in server.log.read_bytes().decode("utf-8", errors="replace")
