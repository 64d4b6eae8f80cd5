"""facefuse.gpu: the torch runtime of the serving models, on the CPU (device cpu, eager).

CUDA graphs themselves need a GPU; here the graph runner's padding and fallback logic runs
with a stand-in capture, and the real capture is exercised by scripts/gpu_check.sh.
"""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.core.errors import ModelLoadError
from facefuse.gpu import runtime as rt


def _params(**kw):
    base = {"runtime": "torch-cpu", "model_dir": "seeded:tiny", "dtype": "float32"}
    base.update(kw)
    return base


def test_runtime_default_is_onnxruntime_and_unknown_is_refused():
    assert rt.runtime_of({}, "unet") == "onnxruntime"
    with pytest.raises(ModelLoadError, match="runtime must be one of"):
        rt.runtime_of({"runtime": "tensorrt-ish"}, "unet")


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"dtype": "float8"}, "dtype"),
        ({"cuda_graphs": "maybe"}, "cuda_graphs"),
        ({"graph_batch_sizes": "0,2"}, "graph_batch_sizes"),
        ({"cuda_fallback": "gpu"}, "cuda_fallback"),
    ],
)
def test_bad_parameters_name_themselves(params, match):
    with pytest.raises(ModelLoadError, match=match):
        rt.settings_from(_params(runtime="torch-cuda", **params), "unet", 16)


def test_graph_batches_always_reach_max_batch_size():
    settings = rt.settings_from(_params(graph_batch_sizes="2,4"), "unet", 16)
    assert settings.graph_batches == (2, 4, 16)
    settings = rt.settings_from(_params(graph_batch_sizes="1,2,4,8,16,32"), "unet", 8)
    assert settings.graph_batches == (1, 2, 4, 8)


def test_cuda_runtime_without_cuda_is_an_error_or_a_logged_cpu_fallback(caplog, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    settings = rt.settings_from(_params(runtime="torch-cuda", dtype="float16"), "unet", 16)
    with pytest.raises(ModelLoadError, match="needs a CUDA GPU"):
        rt.resolve_device(settings, "unet")
    fallback = rt.settings_from(
        _params(runtime="torch-cuda", dtype="float16", cuda_fallback="cpu"), "unet", 16
    )
    with caplog.at_level("WARNING", logger="facefuse.gpu"):
        device, dtype, used = rt.resolve_device(fallback, "unet")
    assert device.type == "cpu" and dtype == torch.float32 and not used.cuda_graphs
    assert "falling back to FP32 eager on the CPU" in caplog.text


def test_torch_kind_from_inputs():
    assert rt.torch_kind(("sample", "timestep", "encoder_hidden_states")) == "unet"
    assert rt.torch_kind(("INPUT_IDS",)) == "text_encoder"
    assert rt.torch_kind(("image",)) == "vae_encoder"
    assert rt.torch_kind(("latent",)) == "vae_decoder"
    with pytest.raises(ModelLoadError):
        rt.torch_kind(("pixels",))


@pytest.fixture(scope="module")
def tiny_sessions():
    sessions = {}
    for kind in rt.KINDS:
        params = _params(warm_latent="8")
        sessions[kind] = rt.open_torch_session(kind, params, kind, "/nonexistent", 4)
    return sessions


def test_torch_session_matches_the_modules_and_batches_rows_independently(tiny_sessions):
    """The session's outputs equal the eager module's, row by row (no cross-row effect)."""
    import torch

    unet = tiny_sessions["unet"]
    rng = np.random.default_rng(0)
    feeds = {
        "sample": rng.standard_normal((3, 4, 8, 8)).astype(np.float32),
        "timestep": np.array([10.0, 500.0, 900.0], dtype=np.float32),
        "encoder_hidden_states": rng.standard_normal((3, 77, 64)).astype(np.float32),
    }
    (batched,) = unet.run(["noise_pred"], feeds)
    assert batched.shape == (3, 4, 8, 8) and batched.dtype == np.float32
    with torch.inference_mode():
        direct = unet.modules["unet"](
            *(torch.from_numpy(feeds[k]) for k in ("sample", "timestep", "encoder_hidden_states")),
            return_dict=False,
        )[0].numpy()
    np.testing.assert_allclose(batched, direct, atol=1e-5)
    one = unet.run(None, {k: v[1:2] for k, v in feeds.items()})[0]
    np.testing.assert_allclose(one[0], batched[1], atol=1e-4)
    assert [i.name for i in unet.get_inputs()] == ["sample", "timestep", "encoder_hidden_states"]


def test_text_and_vae_sessions_have_the_onnx_signatures(tiny_sessions):
    ids = np.full((2, 77), 49407, dtype=np.int64)
    ids[:, 0] = 49406
    hidden, pooled = tiny_sessions["text_encoder"].run(
        ["last_hidden_state", "pooled"], {"input_ids": ids}
    )
    assert hidden.shape == (2, 77, 64) and pooled.shape == (2, 64)
    image = np.zeros((1, 3, 64, 64), dtype=np.float32)
    (latent,) = tiny_sessions["vae_encoder"].run(["latent"], {"image": image})
    assert latent.shape == (1, 4, 8, 8)
    (decoded,) = tiny_sessions["vae_decoder"].run(["image"], {"latent": latent})
    assert decoded.shape == (1, 3, 64, 64) and np.isfinite(decoded).all()
    with pytest.raises(KeyError, match="no output"):
        tiny_sessions["vae_decoder"].run(["nope"], {"latent": latent})


class _FakeCudaTensor:
    """A numpy-backed stand-in exposing what GraphRunner touches, with is_cuda True."""


def test_graph_runner_pads_to_the_next_batch_and_falls_back_when_capture_fails(monkeypatch):
    """With a capture stand-in: rows are padded up to the bucket, outputs cut back; a failed
    capture is recorded and that bucket runs eager (the logic a GPU run depends on)."""
    import torch

    calls = []

    def fn(x):
        calls.append(x.shape[0])
        return (x * 2,)

    runner = rt.GraphRunner(fn, (2, 4), enabled=True, name="t")

    def fake_capture(self, key, padded, tensors):
        if padded == 4:
            self.fallbacks[key] = "RuntimeError: capture failed"
            return
        static_in = [torch.zeros((padded, *tensors[0].shape[1:]))]

        class Graph:
            def replay(self_inner):
                static_out[0].copy_(fn(static_in[0])[0])

        static_out = (torch.zeros((padded, *tensors[0].shape[1:])),)
        self.graphs[key] = (Graph(), static_in, static_out)

    monkeypatch.setattr(rt.GraphRunner, "_capture", fake_capture)
    x = torch.arange(3.0).reshape(1, 3)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    (out,) = runner(x)
    assert out.shape == (1, 3) and torch.equal(out, x * 2)
    assert calls == [2]  # padded to the batch-2 graph
    (out3,) = runner(torch.ones(3, 3))  # bucket 4 failed to capture: eager, 3 rows
    assert calls[-1] == 3 and torch.equal(out3, torch.full((3, 3), 2.0))
    (out5,) = runner(torch.ones(5, 3))  # over the largest bucket: eager
    assert out5.shape == (5, 3)
    status = runner.status()
    assert status["graphs"] == [2] and status["fallbacks"] == {"4": "RuntimeError: capture failed"}
    assert status["replays"] == 1 and status["eager_runs"] == 2


def test_graph_runner_is_eager_on_cpu_tensors():
    import torch

    runner = rt.GraphRunner(lambda x: (x + 1,), (1, 2), enabled=True)
    (out,) = runner(torch.zeros(2, 2))
    assert torch.equal(out, torch.ones(2, 2)) and runner.graphs == {} and runner.eager_runs == 1


def test_served_assembly_writes_a_torch_repository(tmp_path):
    from facefuse.export import configs

    from facefuse.gpu import served

    repo = tmp_path / "repo"
    argv = ["assemble", "--out", str(repo), "--model", "seeded:tiny", "--runtime", "torch-cpu"]
    argv += ["--device", "cpu", "--dtype", "float32", "--no-graphs", "--image", "64"]
    argv += ["--instances", "3", "--queue-delay-us", "2000", "--preferred", "8,16"]
    assert served.main([*argv, "--unet-graph-batches", "2,16"]) == 0
    unet = configs.read(repo / "unet" / "config.pbtxt")  # a valid ModelConfig
    assert configs.get_parameter(unet, "runtime") == "torch-cpu"
    assert configs.get_parameter(unet, "cuda_graphs") == "false"
    assert configs.get_parameter(unet, "graph_batch_sizes") == "2,16"
    assert list(unet.dynamic_batching.preferred_batch_size) == [8, 16]
    assert unet.dynamic_batching.max_queue_delay_microseconds == 2000
    assert [t.name for t in unet.input] == ["sample", "timestep", "encoder_hidden_states"]
    img2img = configs.read(repo / "img2img" / "config.pbtxt")
    assert img2img.instance_group[0].count == 3 and img2img.name == "img2img"
    assert configs.get_parameter(img2img, "scheduler") == "dpm++"
    for name in served.TORCH_MODELS:
        assert (repo / name / "1" / "model.py").is_file()
        config = configs.read(repo / name / "config.pbtxt")
        assert config.name == name and configs.get_parameter(config, "device") == "cpu"


def test_served_config_edits_survive_what_a_regex_would_not():
    from facefuse.gpu import served

    text = (
        'name: "unet"  # a comment with { braces }\n'
        "dynamic_batching {\n  preferred_batch_size: [ 4 ]\n  max_queue_delay_microseconds: 9\n}\n"
        'parameters {\n  key: "runtime"\n  value { string_value: "torch-cuda" }\n}\n'
    )
    config = served.parse_config(text)
    served.set_parameter(config, "runtime", "torch-cpu")
    served.set_parameter(config, "dtype", "float32")
    served.set_batching(config, 0, [])
    again = served.parse_config(served.config_text(config))
    assert dict((k, v.string_value) for k, v in again.parameters.items()) == {
        "runtime": "torch-cpu",
        "dtype": "float32",
    }
    assert again.HasField("dynamic_batching")  # on, with Triton's defaults
    assert list(again.dynamic_batching.preferred_batch_size) == []
    assert again.dynamic_batching.max_queue_delay_microseconds == 0
    with pytest.raises(Exception, match="instance_groups"):
        served.parse_config('name: "x"\ninstance_groups [ { count: 1 } ]\n')  # misspelt


def test_http_binary_encoding_round_trip():
    from facefuse.gpu.served import _encode

    datatype, shape, blob = _encode(np.zeros((2, 3), dtype=np.uint8))
    assert (datatype, shape, len(blob)) == ("UINT8", [2, 3], 6)
    datatype, shape, blob = _encode(b"abc")
    assert (datatype, shape, blob) == ("BYTES", [1], b"\x03\x00\x00\x00abc")
