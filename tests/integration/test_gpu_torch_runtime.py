"""The torch runtime served by a real tritonserver (issue 21), on the CPU: ``runtime:
torch-cpu`` models assembled by ``facefuse.gpu.served`` answer an img2img request over the
stdlib HTTP client, a CUDA runtime on a host without CUDA refuses to load with a message that
says why, and bad input is a 400."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _assemble(out, runtime="torch-cpu", device="cpu"):
    from facefuse.gpu import served

    argv = ["assemble", "--out", str(out), "--model", "seeded:tiny", "--runtime", runtime]
    argv += ["--device", device, "--dtype", "float32", "--no-graphs", "--image", "64"]
    assert served.main([*argv, "--instances", "2"]) == 0
    return out


def test_torch_cpu_repository_serves_img2img(tmp_path):
    from facefuse.gpu.served import infer
    from facefuse.serving.server import LocalTritonServer, ServerConfig

    repo = _assemble(tmp_path / "repo")
    log = tmp_path / "server.log"
    with LocalTritonServer(ServerConfig(repository=repo), log_path=log) as server:
        host, port = server.http_url.split("//")[-1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=300)
        image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
        inputs = {
            "IMAGE": image,
            "PROMPT": b"portrait photo, smiling",
            "STEPS": np.array([4], dtype=np.int32),
            "STRENGTH": np.array([0.5], dtype=np.float32),
        }
        out = infer(conn, "img2img", inputs, ["IMAGE", "INFO"])
        assert out["IMAGE"].shape == (64, 64, 3) and out["IMAGE"].dtype == np.uint8
        info = json.loads(out["INFO"])
        assert info["unet_calls"] == 2 and info["steps_run"] == 2
        with pytest.raises(RuntimeError, match=r"HTTP 400.*IMAGE"):
            infer(conn, "img2img", {**inputs, "IMAGE": image[:32]}, ["IMAGE"])
    assert "torch runtime torch-cpu float32 on cpu" in log.read_text()


def test_cuda_runtime_without_cuda_fails_the_load_with_the_reason(tmp_path):
    import torch

    from facefuse.serving.server import LocalTritonServer, ServerConfig, ServerError

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    repo = _assemble(tmp_path / "repo", runtime="torch-cuda", device="cuda:0")
    for name in ("img2img", "unet", "vae_encoder", "vae_decoder"):
        (repo / name / "config.pbtxt").unlink()  # keep text_encoder only: a fast refusal
        for path in sorted((repo / name).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        (repo / name).rmdir()
    log = tmp_path / "server.log"
    config = ServerConfig(repository=repo, ready_timeout_s=120)
    with pytest.raises(ServerError):
        with LocalTritonServer(config, log_path=log):
            pass
    assert "needs a CUDA GPU" in log.read_text()
