"""The tensor contract: one definition that configs, stubs and clients agree with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from facefuse.export import configs

from facefuse.core import contract
from facefuse.core.errors import InvalidInput
from facefuse.core.limits import DEFAULT_LIMITS
from facefuse.diffusion import pipeline

REPOSITORY = Path(__file__).resolve().parents[3] / "model_repository"
CONFIGS = sorted(REPOSITORY.glob("*/config.pbtxt")) + sorted(REPOSITORY.glob("*/configs/*.pbtxt"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPOSITORY)))
def test_every_shipped_config_declares_the_contracts_signature(path):
    config = configs.read(path)
    assert config.name in contract.MODELS, f"{config.name}: add it to facefuse.core.contract"
    assert configs.contract_mismatches(config, contract.MODELS[config.name]) == []


def test_every_model_folder_is_in_the_contract():
    assert {p.parent.name for p in REPOSITORY.glob("*/config.pbtxt")} == set(contract.MODELS)


def test_defaults_and_ranges_are_the_pipelines_and_the_limits():
    assert contract.STEPS.default == pipeline.DEFAULT_STEPS
    assert contract.STRENGTH.default == pipeline.DEFAULT_STRENGTH
    assert contract.GUIDANCE.default == pipeline.DEFAULT_GUIDANCE
    assert contract.SEED.default == pipeline.DEFAULT_SEED
    assert contract.STEPS.range == (DEFAULT_LIMITS.min_steps, DEFAULT_LIMITS.max_steps)
    assert contract.SEED.range == (0, DEFAULT_LIMITS.max_seed)


def test_latent_channels_are_variable():
    for tensor in (contract.SAMPLE, contract.NOISE_PRED, contract.LATENT):
        assert tensor.dims[0] == -1


def test_facefusion_request_sends_what_is_given_with_the_contracts_dtypes():
    request = contract.facefusion_request(b"a", b"b", "make her smile", steps=4, seed=7)
    assert list(request) == ["SOURCE_IMAGE", "TARGET_IMAGE", "INSTRUCTION", "STEPS", "SEED"]
    for name, array in request.items():
        tensor = contract.FACEFUSION.tensor(name)
        assert array.dtype == tensor.numpy_dtype and array.shape == (1,)
    assert request["INSTRUCTION"][0] == b"make her smile"
    assert request["STEPS"].dtype == np.int32 and request["SEED"].dtype == np.int64


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"steps": 0}, "STEPS"),
        ({"strength": 2.0}, "STRENGTH"),
        ({"guidance": float("nan")}, "GUIDANCE"),
    ],
)
def test_facefusion_request_refuses_what_the_server_refuses(kwargs, field):
    with pytest.raises(InvalidInput, match=field):
        contract.facefusion_request(b"a", b"b", "smile", **kwargs)


def test_txt2img_request_has_no_strength():
    request = contract.txt2img_request("a portrait", guidance=5.0)
    assert list(request) == ["PROMPT", "GUIDANCE"]


def test_infer_inputs_declare_the_contracts_dtypes():
    import tritonclient.http as httpclient

    request = contract.facefusion_request(b"a", b"b", "smile", steps=3)
    inputs = contract.infer_inputs(httpclient, contract.FACEFUSION, request)
    assert [(i.name(), i.datatype()) for i in inputs] == [
        ("SOURCE_IMAGE", "BYTES"),
        ("TARGET_IMAGE", "BYTES"),
        ("INSTRUCTION", "BYTES"),
        ("STEPS", "INT32"),
    ]
