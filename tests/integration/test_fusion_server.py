"""Face fusion through a real tritonserver, over gRPC and HTTP, including every error path."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from facefuse.client import Client, ClientError
from PIL import Image
from tritonclient.utils import InferenceServerException

from facefuse.core.metrics import sample_total, scrape

pytestmark = pytest.mark.integration

FAST = {"steps": 4, "strength": 0.5, "seed": 7}
INSTRUCTION = "make her smile, keep the glasses"


def png_size(data: bytes) -> tuple[int, int]:
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return image.size


def image_bytes(array: np.ndarray, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt)
    return buffer.getvalue()


def raw_inputs(module, source: bytes, target: bytes, instruction: str, **scalars):
    """Build facefusion inputs directly, bypassing the client's own validation."""
    tensors = {
        "SOURCE_IMAGE": (np.array([source], dtype=object), "BYTES"),
        "TARGET_IMAGE": (np.array([target], dtype=object), "BYTES"),
        "INSTRUCTION": (np.array([instruction.encode()], dtype=object), "BYTES"),
    }
    types = {
        "STEPS": (np.int32, "INT32"),
        "STRENGTH": (np.float32, "FP32"),
        "SEED": (np.int64, "INT64"),
    }
    for name, value in scalars.items():
        dtype, triton_type = types[name]
        tensors[name] = (np.array([value], dtype=dtype), triton_type)
    inputs = []
    for name, (array, triton_type) in tensors.items():
        tensor = module.InferInput(name, list(array.shape), triton_type)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_fuse_over_grpc_returns_png_of_target_size(server, sample_images):
    source, target = sample_images
    with Client(server.grpc_url, "grpc") as client:
        result = client.fuse(source, target, INSTRUCTION, **FAST)
    assert png_size(result.png) == Image.open(io.BytesIO(target)).size
    info = result.info
    assert info["steps"] == 4 and info["steps_run"] == 2  # strength 0.5 runs half the steps
    assert info["tokens_after"] <= info["tokens_before"]
    assert {"face", "prompt", "text_encoder", "vae_encoder", "denoise", "vae_decoder"} <= set(
        info["stage_ms"]
    )
    fused = np.asarray(Image.open(io.BytesIO(result.png)).convert("RGB"))
    original = np.asarray(Image.open(io.BytesIO(target)).convert("RGB"))
    changed = np.any(fused != original, axis=2)
    assert 0.001 < changed.mean() < 0.5  # the face region changed, most of B did not


@pytest.mark.parametrize("instruction", ["", "keep the expression", "换脸", "保持表情"])
def test_a_plain_swap_needs_no_instruction(server, sample_images, instruction):
    source, target = sample_images
    with Client(server.grpc_url, "grpc") as client:
        result = client.fuse(source, target, instruction, **FAST)
    assert result.info["asked"] == "nothing" and result.info["instruction"] == instruction
    assert png_size(result.png) == Image.open(io.BytesIO(target)).size
    with Client(server.grpc_url, "grpc") as client:
        edited = client.fuse(source, target, "make her smile", **FAST)
    assert edited.info["asked"] == "edit"


def test_fuse_over_http_is_deterministic_and_matches_grpc(server, sample_images):
    source, target = sample_images
    with Client(server.http_url, "http") as client:
        first = client.fuse(source, target, INSTRUCTION, **FAST)
        second = client.fuse(source, target, INSTRUCTION, **FAST)
    with Client(server.grpc_url, "grpc") as client:
        third = client.fuse(source, target, INSTRUCTION, **FAST)
    assert first.png == second.png == third.png
    # the shipped default starts from the composite's DDIM inversion: SEED draws no noise
    with Client(server.http_url, "http") as client:
        other_seed = client.fuse(source, target, INSTRUCTION, **{**FAST, "seed": 8})
    assert other_seed.info["inversion"] is True and other_seed.png == first.png


def test_a_request_without_steps_runs_the_served_default_steps(server, sample_images):
    """``default_steps`` and ``default_strength`` in facefusion's config fill an absent STEPS
    and STRENGTH; txt2img's config names neither and keeps 20 steps."""
    from facefuse.export.configs import get_parameter, read

    shipped = read(Path(__file__).resolve().parents[2] / "model_repository/facefusion/config.pbtxt")
    default = int(get_parameter(shipped, "default_steps"))
    source, target = sample_images
    with Client(server.grpc_url, "grpc") as client:
        result = client.fuse(source, target, INSTRUCTION, strength=0.5, seed=7)
    assert default != 20 and result.info["steps"] == default
    assert result.info["steps_run"] == default // 2
    strength = float(get_parameter(shipped, "default_strength"))
    with Client(server.grpc_url, "grpc") as client:
        result = client.fuse(source, target, INSTRUCTION, seed=7)
    assert strength != 0.5 and result.info["strength"] == strength
    assert result.info["steps_run"] == round(default * strength)


def test_txt2img_over_http(server):
    with Client(server.http_url, "http") as client:
        result = client.txt2img("portrait of a smiling woman, studio light", steps=3, seed=1)
    assert png_size(result.png) == (256, 256)
    assert result.info["steps_run"] == 3


def _bad_requests():
    flat = image_bytes(np.full((256, 256, 3), 128, dtype=np.uint8))
    # a valid PNG whose header claims 5000 x 4000 pixels: over the 16.7 Mpx limit
    huge = image_bytes(np.zeros((4000, 5000, 3), dtype=np.uint8))
    return {
        "undecodable source": (dict(source=b"not an image at all"), "SOURCE_IMAGE"),
        "undecodable target": (dict(target=b"\x89PNG\r\n\x1a\n broken"), "TARGET_IMAGE"),
        "over pixel limit": (dict(target=huge), "TARGET_IMAGE"),
        "no face in A": (dict(source=flat), "SOURCE_IMAGE"),
        "no face in B": (dict(target=flat), "TARGET_IMAGE"),
        "steps out of range": (dict(STEPS=0), "STEPS"),
        "too many steps": (dict(STEPS=1000), "STEPS"),
        "strength out of range": (dict(STRENGTH=1.5), "STRENGTH"),
        "control characters": (dict(instruction="smile\x01"), "INSTRUCTION"),
    }


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bad_input_is_invalid_argument_and_server_keeps_serving(server, sample_images, protocol):
    source, target = sample_images
    module = grpcclient if protocol == "grpc" else httpclient
    url = server.grpc_url if protocol == "grpc" else server.http_url
    client = module.InferenceServerClient(url)
    try:
        for case, (override, field) in _bad_requests().items():
            args = {"source": source, "target": target, "instruction": INSTRUCTION}
            scalars = {"STEPS": 2, "SEED": 1}
            for key, value in override.items():
                (scalars if key.isupper() else args)[key] = value
            with pytest.raises(InferenceServerException) as caught:
                client.infer("facefusion", raw_inputs(module, **args, **scalars))
            status = str(caught.value.status())
            expected = "StatusCode.INVALID_ARGUMENT" if protocol == "grpc" else "400"
            assert status == expected, (case, status, caught.value.message())
            assert field in caught.value.message(), (case, caught.value.message())
            assert "Traceback" not in caught.value.message()
        # the next valid request still succeeds
        response = client.infer(
            "facefusion", raw_inputs(module, source, target, INSTRUCTION, STEPS=2)
        )
        assert png_size(response.as_numpy("IMAGE").reshape(-1)[0])
    finally:
        client.close()


def test_client_reports_server_error_as_one_line(server, sample_images):
    source, _ = sample_images
    flat = image_bytes(np.full((128, 128, 3), 90, dtype=np.uint8))
    with Client(server.grpc_url, "grpc") as client, pytest.raises(ClientError) as caught:
        client.fuse(source, flat, INSTRUCTION, steps=2)
    assert "TARGET_IMAGE" in str(caught.value) and "\n" not in str(caught.value)


def test_unet_forms_batches_larger_than_one_under_concurrency(server, sample_images):
    source, target = sample_images

    before = scrape(server.metrics_url)

    def one(seed: int):
        with Client(server.grpc_url, "grpc") as client:
            # 40 full-strength steps: long enough that the denoising loops of the two
            # facefusion instances overlap even though face analysis runs one at a time
            return client.fuse(source, target, INSTRUCTION, steps=40, strength=1.0, seed=seed)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, range(4)))
    assert len({r.png for r in results}) == 4
    after = scrape(server.metrics_url)
    delta = {
        name: sample_total(after, name, model="unet") - sample_total(before, name, model="unet")
        for name in (
            "nv_inference_count",
            "nv_inference_exec_count",
            "facefuse_onnx_samples_total",
            "facefuse_onnx_forwards_total",
        )
    }
    # every request carries 2 rows (cond + uncond): more than 2 rows per forward means that
    # requests of different pipelines were concatenated into one ONNX forward
    triton_rows_per_exec = delta["nv_inference_count"] / delta["nv_inference_exec_count"]
    rows_per_forward = delta["facefuse_onnx_samples_total"] / delta["facefuse_onnx_forwards_total"]
    assert triton_rows_per_exec > 2.0, delta
    assert rows_per_forward > 2.0, delta


def test_info_never_echoes_input_bytes(server, sample_images):
    source, target = sample_images
    with Client(server.http_url, "http") as client:
        result = client.fuse(source, target, INSTRUCTION, **FAST)
    text = json.dumps(result.info)
    assert len(text) < 4000


def _facefuse(*args: str):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "facefuse.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_fuse_writes_png_and_fails_with_one_line(server, sample_images, tmp_path):
    source, target = sample_images
    (tmp_path / "a.jpg").write_bytes(source)
    (tmp_path / "b.png").write_bytes(target)
    out = tmp_path / "fused.png"
    common = [
        "--instruction",
        INSTRUCTION,
        "--steps",
        "2",
        "--url",
        server.http_url,
        "--protocol",
        "http",
    ]
    ok = _facefuse(
        "fuse",
        "--source",
        str(tmp_path / "a.jpg"),
        "--target",
        str(tmp_path / "b.png"),
        "-o",
        str(out),
        *common,
    )
    assert ok.returncode == 0, ok.stderr
    assert png_size(out.read_bytes()) == (512, 512)
    (tmp_path / "flat.png").write_bytes(image_bytes(np.full((200, 200, 3), 30, dtype=np.uint8)))
    bad = _facefuse(
        "fuse",
        "--source",
        str(tmp_path / "flat.png"),
        "--target",
        str(tmp_path / "b.png"),
        "-o",
        str(tmp_path / "x.png"),
        *common,
    )
    assert bad.returncode != 0
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "SOURCE_IMAGE" in lines[0], bad.stderr
