"""Limits, CLI help, client-side validation and server configuration (no server started)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from facefuse.core.errors import InvalidInput
from facefuse.core.limits import check_instruction, check_params


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 0.5, 7.5, 0), "STEPS"),
        ((101, 0.5, 7.5, 0), "STEPS"),
        ((20, 0.0, 7.5, 0), "STRENGTH"),
        ((20, math.nan, 7.5, 0), "STRENGTH"),
        ((20, 0.5, math.inf, 0), "GUIDANCE"),
        ((20, 0.5, 7.5, -1), "SEED"),
    ],
)
def test_params_out_of_range_name_the_field(args, field):
    with pytest.raises(InvalidInput) as caught:
        check_params(*args)
    assert caught.value.field == field and field in str(caught.value)


@pytest.mark.parametrize("text", ["", "   \n", "x" * 5000, "smile\x00now"])
def test_bad_instructions_are_refused(text):
    with pytest.raises(InvalidInput, match="INSTRUCTION"):
        check_instruction(text)


FLAGS = {
    "fuse": [
        "--source",
        "--target",
        "--instruction",
        "--output",
        "--protocol",
        "--url",
        "--steps",
        "--strength",
        "--guidance",
        "--seed",
        "--timeout",
        "--info",
    ],
    "export": ["--model", "--out", "--precision", "--target"],
    "serve": [
        "--repository",
        "--http-port",
        "--grpc-port",
        "--metrics-port",
        "--config",
        "--public",
        "--admin-key",
        "--unrestricted",
        "--log",
    ],
}


@pytest.mark.parametrize("command", sorted(FLAGS))
def test_help_explains_every_flag(command):
    import argparse

    from facefuse.cli import build_parser

    out = subprocess.run(
        [sys.executable, "-m", "facefuse.cli", command, "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    actions = {
        option: action
        for action in subparsers.choices[command]._actions
        for option in action.option_strings
    }
    for flag in FLAGS[command]:
        assert flag in out, flag
        assert len(actions[flag].help or "") > 10, flag  # a real explanation, not a stub
    undocumented = [o for o, a in actions.items() if not a.help]
    assert not undocumented


def test_client_validates_before_sending(tmp_path):
    from facefuse.client.api import fusion_inputs

    (tmp_path / "a.png").write_bytes(b"x")
    with pytest.raises(InvalidInput, match="SOURCE_IMAGE"):
        fusion_inputs(tmp_path / "missing.png", tmp_path / "a.png", "smile")
    with pytest.raises(InvalidInput, match="STEPS"):
        fusion_inputs(tmp_path / "a.png", tmp_path / "a.png", "smile", steps=0)
    with pytest.raises(InvalidInput, match="protocol"):
        from facefuse.client.api import Client

        Client("127.0.0.1:1", protocol="ftp")


def test_client_sends_the_expression_and_face_selection_fields(tmp_path):
    from facefuse.client.api import fusion_inputs

    photo = tmp_path / "a.png"
    photo.write_bytes(b"x")
    tensors = fusion_inputs(
        photo, photo, "smile", expression_source="source", expression_smile=1.5,
        expression_mouth_open=0.5, face_select="reference", reference_face=photo,
    )  # fmt: skip
    assert tensors["EXPRESSION_SOURCE"].tolist() == [b"source"]
    assert tensors["EXPRESSION_SMILE"].tolist() == [1.5]
    assert tensors["EXPRESSION_MOUTH_OPEN"].tolist() == [0.5]
    assert tensors["FACE_SELECT"].tolist() == [b"reference"]
    assert tensors["REFERENCE_FACE"].tolist() == [b"x"]
    assert "EXPRESSION_SMILE" not in fusion_inputs(photo, photo, "smile")
    with pytest.raises(InvalidInput, match="EXPRESSION_SMILE"):
        fusion_inputs(photo, photo, "smile", expression_smile=3.0)
    with pytest.raises(InvalidInput, match="REFERENCE_FACE"):
        fusion_inputs(photo, photo, "smile", face_select="reference", reference_face=tmp_path / "x")


def test_cli_error_is_one_line_and_nonzero(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "facefuse.cli",
            "fuse",
            "--source",
            str(tmp_path / "nope.jpg"),
            "--target",
            str(tmp_path / "nope.png"),
            "--instruction",
            "smile",
            "-o",
            str(tmp_path / "o.png"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "SOURCE_IMAGE" in result.stderr


def test_server_config_restricts_admin_apis_and_stays_on_loopback(tmp_path):
    from facefuse.serving.server import LocalTritonServer, ServerConfig, ServerError, TritonPaths

    config = ServerConfig(repository=tmp_path)
    assert config.host == "127.0.0.1" and 0 < config.http_port < 65536 and config.admin_key
    command = LocalTritonServer(config).command(TritonPaths.find())
    assert any(
        a.startswith("--http-restricted-api=model-repository,shared-memory,trace,logging:")
        for a in command
    )
    assert any(a.startswith("--grpc-restricted-protocol=") for a in command)
    assert "--http-address=127.0.0.1" in command
    with pytest.raises(ServerError, match="repository"):
        ServerConfig(repository=tmp_path / "missing")
    with pytest.raises(ServerError, match="host"):
        ServerConfig(repository=tmp_path, host="10.0.0.1")


def test_an_older_checkout_is_imported_first_by_the_stubs_python(tmp_path):
    """The stub ignores PYTHONPATH (isolated mode) and takes the first python3 on PATH."""
    import os
    import subprocess

    from facefuse.serving.server import LocalTritonServer, ServerConfig

    checkout = tmp_path / "old"
    (checkout / "facefuse").mkdir(parents=True)
    (checkout / "facefuse" / "__init__.py").write_text("OLD = True\n")
    server = LocalTritonServer(ServerConfig(repository=tmp_path, python_path=checkout))
    first = type(tmp_path)(server.environment()["PATH"].split(os.pathsep)[0])
    assert first.parent == checkout.resolve() / ".facefuse-stub-venv"
    probe = "import facefuse, numpy; print(facefuse.OLD)"  # numpy: this environment's packages
    out = subprocess.run([first / "python3", "-I", "-c", probe], capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr
    plain = LocalTritonServer(ServerConfig(repository=tmp_path)).environment()
    assert ".facefuse-stub-venv" not in plain["PATH"]
