"""``runtime: openvino``: the exported ONNX UNet under OpenVINO, behind ORT's session interface."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from facefuse.core.errors import ModelLoadError
from facefuse.runtime.sessions import SessionOptions, open_session

pytest.importorskip("openvino")


def _feeds(session, rows=2, seed=0):
    rng = np.random.default_rng(seed)
    sample, _, context = session.get_inputs()
    return {
        "sample": rng.standard_normal((rows, sample.shape[1], 8, 8)).astype(np.float32),
        "timestep": np.linspace(900, 10, rows).astype(np.float32),
        "encoder_hidden_states": rng.standard_normal((rows, 77, context.shape[2])).astype(
            np.float32
        ),
    }


def test_f32_matches_onnx_runtime_and_bf16_stays_close(tiny_repository):
    graph = tiny_repository / "unet" / "1" / "model.onnx"
    reference_session = open_session(graph, SessionOptions(1))
    feeds = _feeds(reference_session)
    (reference,) = reference_session.run(None, feeds)
    f32 = open_session(graph, SessionOptions(1), "openvino", "f32")
    assert [i.name for i in f32.get_inputs()] == [i.name for i in reference_session.get_inputs()]
    (out,) = f32.run(["noise_pred"], feeds)
    assert out.shape == reference.shape
    np.testing.assert_allclose(out, reference, atol=1e-4 * max(1.0, np.abs(reference).max()))
    (low,) = open_session(graph, SessionOptions(1), "openvino", "bf16").run(None, feeds)
    peak, mse = np.abs(reference).max(), float(((low - reference) ** 2).mean())
    assert 10 * np.log10(peak**2 / max(mse, 1e-20)) > 30  # the precision gate's PSNR bar


def test_runs_from_several_threads_at_once(tiny_repository):
    session = open_session(tiny_repository / "unet" / "1" / "model.onnx", runtime="openvino")
    feeds = [_feeds(session, rows=1, seed=s) for s in range(4)]
    expected = [session.run(None, f)[0] for f in feeds]
    got = [None] * 4

    def work(i):
        got[i] = session.run(None, feeds[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_missing_graph_bad_precision_and_unknown_runtime_are_load_errors(tmp_path, tiny_repository):
    with pytest.raises(ModelLoadError, match="not found"):
        open_session(tmp_path / "none.onnx", runtime="openvino")
    graph = tiny_repository / "unet" / "1" / "model.onnx"
    with pytest.raises(ModelLoadError, match="precision"):
        open_session(graph, runtime="openvino", precision="int4")
    with pytest.raises(ModelLoadError, match="runtime"):
        open_session(graph, runtime="tensorflow")


def test_local_stages_open_the_graphs_on_the_runtime_the_configs_name(tiny_repository, monkeypatch):
    """The shipped configs serve the VAEs on OpenVINO bf16 and the UNet on ``auto``
    (``served_runtimes`` reads and resolves them); ``local_stages`` opens each on its runtime,
    the rest on ONNX Runtime, and the decoded image stays within the precision gate's PSNR bar
    of ORT's."""
    from facefuse.bench.e2e import served_runtimes
    from facefuse.diffusion.stages import local_stages
    from facefuse.runtime import sessions

    runtimes = served_runtimes(tiny_repository)
    # the UNet's runtime auto: a graph under openvino_min_mb stays on ONNX Runtime everywhere
    assert runtimes == {m: ("openvino", "bf16") for m in ("vae_encoder", "vae_decoder")} | {
        "unet": ("onnxruntime", "bf16")
    }
    opened = {}
    real = sessions.open_session

    def recording(path, options, runtime="onnxruntime", precision="bf16"):
        opened[path.parent.parent.name] = runtime
        return real(path, options, runtime, precision)

    monkeypatch.setattr(sessions, "open_session", recording)
    on_openvino = local_stages(tiny_repository, runtimes=runtimes)
    assert opened["vae_decoder"] == opened["vae_encoder"] == "openvino"
    assert opened["unet"] == opened["text_encoder"] == "onnxruntime"
    on_ort = local_stages(tiny_repository)
    assert set(opened.values()) == {"onnxruntime"}
    latent = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    expected, got = on_ort.decode_latents(latent), on_openvino.decode_latents(latent)
    mse = float(((got - expected) ** 2).mean())
    assert 10 * np.log10(np.abs(expected).max() ** 2 / max(mse, 1e-20)) > 30


def test_runtime_auto_picks_openvino_for_a_large_graph_where_bf16_is_native(tmp_path):
    from facefuse.runtime.openvino import native_bf16, resolve_auto

    (tmp_path / "model.onnx").write_bytes(b"0" * 2000)  # 0.002 MB
    params = {"runtime": "auto", "onnx_file": "model.int8.onnx", "parallel_runs": "2",
              "openvino_min_mb": "0.001"}  # fmt: skip
    native = resolve_auto(params, tmp_path, bf16=True)
    assert native == {**params, "runtime": "openvino", "onnx_file": "model.onnx",
                      "parallel_runs": "1"}  # fmt: skip
    on_ort = {**params, "runtime": "onnxruntime"}
    assert resolve_auto(params, tmp_path, bf16=False) == on_ort
    small = {**params, "openvino_min_mb": "0.003"}
    assert resolve_auto(small, tmp_path, bf16=True) == {**small, "runtime": "onnxruntime"}
    assert (
        resolve_auto({**params, "openvino_file": "model.fp16.onnx"}, tmp_path, True)["runtime"]
        == "onnxruntime"
    )  # no such file: ORT, whose missing onnx_file then fails the load
    (tmp_path / "model.fp16.onnx").write_bytes(b"0" * 2000)
    other = resolve_auto({**params, "openvino_file": "model.fp16.onnx"}, tmp_path, bf16=True)
    assert other["onnx_file"] == "model.fp16.onnx"
    (tmp_path / "model.onnx.data").write_bytes(b"0" * 2000)  # weights saved beside the graph
    assert resolve_auto(small, tmp_path, bf16=True)["runtime"] == "openvino"
    pinned = {"runtime": "onnxruntime", "onnx_file": "model.int8.onnx"}
    assert resolve_auto(pinned, tmp_path, bf16=True) is pinned
    expected = "openvino" if native_bf16() else "onnxruntime"
    assert resolve_auto(params, tmp_path)["runtime"] == expected
    with pytest.raises(ModelLoadError, match=r"\w+: parameter openvino_min_mb must be a number"):
        resolve_auto({**params, "openvino_min_mb": "big"}, tmp_path)


def test_an_unknown_runtime_fails_the_load_naming_it():
    from facefuse.gpu.runtime import runtime_of

    assert runtime_of({"runtime": "auto"}, "unet") == "auto"
    with pytest.raises(ModelLoadError, match="unet: parameter runtime must be one of"):
        runtime_of({"runtime": "openvino-gpu"}, "unet")
