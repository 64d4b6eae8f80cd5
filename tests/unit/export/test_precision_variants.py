"""Precision variants: INT8 / FP16 conversion (with external data), variant folders, CLI."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest


def _unet_feeds(latent: int = 32, text_dim: int = 64, batch: int = 2):
    rng = np.random.default_rng(0)
    return {
        "sample": rng.standard_normal((batch, 4, latent, latent)).astype(np.float32),
        "timestep": np.array([500.0] * batch, dtype=np.float32),
        "encoder_hidden_states": rng.standard_normal((batch, 77, text_dim)).astype(np.float32),
    }


def _op_types(path):
    import onnx

    return {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}


def _run(path, feeds):
    from facefuse.runtime.sessions import open_session

    return open_session(path).run(None, feeds)[0]


def test_int8_quantises_only_the_chosen_operators(tiny_repository, tmp_path):
    from facefuse.export.quantize import quantize_int8

    source = tiny_repository / "unet" / "1" / "model.onnx"
    matmul = quantize_int8(source, tmp_path / "mm" / "model.int8.onnx")
    ops = _op_types(matmul.path)
    assert {"DynamicQuantizeLinear", "MatMulInteger"} & ops and "ConvInteger" not in ops
    assert "Conv" in ops  # convolutions stay fp32 (quantised Conv measured 2x slower)
    with_conv = quantize_int8(source, tmp_path / "conv" / "m.onnx", ("MatMul", "Gemm", "Conv"))
    assert "ConvInteger" in _op_types(with_conv.path)
    assert matmul.bytes < matmul.source_bytes and not matmul.external_data
    feeds = _unet_feeds()
    reference, quantised = _run(source, feeds), _run(matmul.path, feeds)
    error = np.abs(reference - quantised).max() / np.abs(reference).max()
    assert 0 < error < 0.05


def test_attention_fusion_keeps_the_function_on_the_cpu_kernel(tiny_repository, tmp_path):
    from facefuse.export.attention import fuse_attention

    source = tiny_repository / "unet" / "1" / "model.onnx"
    fused = tmp_path / "fused.onnx"
    report = fuse_attention(source, fused)
    ops = _op_types(fused)
    # every attention runs in the CPU's MultiHeadAttention kernel; no score tensor is left
    assert "MultiHeadAttention" in ops and not {"Attention", "Softmax"} & ops
    assert report.self_attention_rewritten == report.fused["Attention"] > 0
    assert report.fused["MultiHeadAttention"] > 0  # the cross-attentions
    for batch in (1, 3):
        feeds = _unet_feeds(batch=batch)
        assert np.abs(_run(source, feeds) - _run(fused, feeds)).max() < 1e-4


def test_served_int8_unet_is_fused_then_quantised(tiny_repository, tmp_path):
    from facefuse.export.quantize import fused_int8

    source = tiny_repository / "unet" / "1" / "model.onnx"
    result = fused_int8(source, tmp_path / "v" / "model.int8.onnx")
    assert result.source == source and result.bytes < result.source_bytes
    diff, scale = result.fusion_check
    assert 0 <= diff < 1e-4 * scale and scale > 0
    assert sorted(p.name for p in result.path.parent.iterdir()) == ["model.int8.onnx"]
    ops = _op_types(result.path)
    assert "MultiHeadAttention" in ops and {"DynamicQuantizeMatMul", "MatMulInteger"} & ops
    feeds = _unet_feeds()
    reference = _run(source, feeds)
    error = np.abs(_run(result.path, feeds) - reference).max() / np.abs(reference).max()
    assert 0 < error < 0.05


@pytest.mark.parametrize("failure", ["optimizer raises", "fused graph differs"])
def test_int8_falls_back_to_the_plain_graph_when_fusion_fails(
    tiny_repository, tmp_path, monkeypatch, caplog, failure
):
    from facefuse.export import attention, quantize

    source = tiny_repository / "unet" / "1" / "model.onnx"
    if failure == "optimizer raises":

        def broken(source, destination):
            raise RuntimeError("unknown pattern")

        monkeypatch.setattr(attention, "fuse_attention", broken)
    else:
        monkeypatch.setattr(attention, "fusion_error", lambda source, fused: (1.0, 2.0))
    result = quantize.fused_int8(source, tmp_path / "v" / "model.int8.onnx")
    assert result.fusion_check is None
    assert "quantising the plain graph" in caplog.text
    assert "MultiHeadAttention" not in _op_types(result.path)  # the plain graph, quantised
    feeds = _unet_feeds()
    reference = _run(source, feeds)
    assert np.abs(_run(result.path, feeds) - reference).max() < 0.05 * np.abs(reference).max()


def test_large_unets_are_fused_in_a_child_process_with_the_same_result(
    tiny_repository, tmp_path, monkeypatch
):
    from facefuse.export import quantize

    source = tiny_repository / "unet" / "1" / "model.onnx"
    here = quantize.fused_int8(source, tmp_path / "here" / "model.int8.onnx")
    monkeypatch.setattr(quantize, "FUSE_IN_CHILD_BYTES", 0)
    child = quantize.fused_int8(source, tmp_path / "child" / "model.int8.onnx")
    feeds = _unet_feeds()
    np.testing.assert_array_equal(_run(here.path, feeds), _run(child.path, feeds))


def test_large_models_keep_external_data_through_int8_and_fp16(
    tiny_repository, tmp_path, monkeypatch
):
    """Over the limit every conversion writes <file>.data (the limit is lowered to test it)."""
    import onnx
    from facefuse.export import quantize
    from facefuse.export.gpu import convert_fp16

    source = tmp_path / "src" / "model.onnx"
    model = onnx.load(str(tiny_repository / "unet" / "1" / "model.onnx"))
    quantize.save_model(model, source, large=True)  # like a real SD 1.5 export
    assert source.with_name("model.onnx.data").is_file()
    assert quantize.model_bytes(source) > source.stat().st_size * 10
    monkeypatch.setattr(quantize, "EXTERNAL_DATA_LIMIT", 10_000)
    int8 = quantize.quantize_int8(source, tmp_path / "out" / "model.int8.onnx")
    fused = quantize.fused_int8(source, tmp_path / "fused" / "model.int8.onnx")
    fp16 = convert_fp16(source, tmp_path / "out" / "model.fp16.onnx")
    feeds = _unet_feeds()
    reference = _run(source, feeds)
    for result in (int8, fused, fp16):
        data = result.path.with_name(result.path.name + ".data")
        assert result.external_data and data.is_file(), result
        assert quantize.external_files(result.path) == [data]
        error = np.abs(_run(result.path, feeds) - reference).max() / np.abs(reference).max()
        assert error < 0.05, (result.path.name, error)


def test_fp16_graph_has_half_weights_and_fp32_interface(tiny_repository, tmp_path):
    import onnx
    from facefuse.export.gpu import convert_fp16

    result = convert_fp16(
        tiny_repository / "vae_decoder" / "1" / "model.onnx", tmp_path / "model.fp16.onnx"
    )
    model = onnx.load(str(result.path))
    types = {i.data_type for i in model.graph.initializer if i.dims and np.prod(i.dims) > 16}
    assert types == {onnx.TensorProto.FLOAT16}
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert result.bytes < 0.6 * result.source_bytes


def test_variant_names_and_files():
    from facefuse.runtime.variants import onnx_file, variant_files, variant_model_names

    assert onnx_file("fp32") == "model.onnx" and onnx_file("int8") == "model.int8.onnx"
    assert variant_files("int8") == {
        "text_encoder": "model.onnx",
        "unet": "model.int8.onnx",
        "unet_deep": "model.int8.onnx",
        "unet_shallow": "model.int8.onnx",
        "vae_encoder": "model.onnx",
        "vae_decoder": "model.onnx",
    }
    assert variant_files("fp16")["vae_decoder"] == "model.fp16.onnx"
    assert variant_model_names("int8")["unet"] == "unet_int8"
    assert variant_model_names("int8")["vae_decoder"] == "vae_decoder"
    assert variant_model_names(None)["unet"] == "unet"
    with pytest.raises(ValueError, match="precision must be one of"):
        onnx_file("int4")


def test_variant_model_folders_point_at_the_variant_file(tiny_repository, tmp_path):
    from facefuse.export.quantize import export_cpu_variant
    from facefuse.export.repository import write_variant_models

    from facefuse.runtime.sessions import open_session

    repo = shutil.copytree(tiny_repository, tmp_path / "repo", symlinks=True)
    if not (repo / "unet" / "1" / "model.int8.onnx").exists():
        export_cpu_variant(repo, "int8")
    folder, *deep_cache = write_variant_models(repo, "int8")
    assert folder.name == "unet_int8"
    assert [f.name for f in deep_cache] == ["unet_deep_int8", "unet_shallow_int8"]
    config = (folder / "config.pbtxt").read_text()
    assert 'name: "unet_int8"' in config and 'name: "unet"' not in config
    assert config.count('key: "onnx_file"') == 1
    assert 'string_value: "model.int8.onnx"' in config
    # a precision variant serves its own file: unet's `runtime: auto` is pinned to ORT
    assert 'string_value: "auto"' in (repo / "unet" / "config.pbtxt").read_text()
    from facefuse.export.configs import get_parameter, read

    assert get_parameter(read(folder / "config.pbtxt"), "runtime") == "onnxruntime"
    gpu = (folder / "configs" / "gpu.pbtxt").read_text()
    assert 'name: "unet_int8"' in gpu and 'default_model_filename: "model.int8.onnx"' in gpu
    assert 'platform: "onnxruntime_onnx"' in gpu and "tensorrt_plan" not in gpu
    link = folder / "1" / "model.int8.onnx"
    assert link.is_symlink() and link.resolve() == (repo / "unet/1/model.int8.onnx").resolve()
    assert (folder / "1" / "model.py").is_symlink()
    feeds = _unet_feeds()
    np.testing.assert_array_equal(
        open_session(link).run(None, feeds)[0],
        open_session(repo / "unet/1/model.int8.onnx").run(None, feeds)[0],
    )
    # the fp32 fallback folders on GPU: unet_fp32 serves model.onnx with ORT, not the plan
    names = [f.name for f in write_variant_models(repo, "fp32")]
    assert names == ["unet_fp32", "vae_encoder_fp32", "vae_decoder_fp32"]
    assert (
        'default_model_filename: "model.onnx"'
        in (repo / "unet_fp32" / "configs" / "gpu.pbtxt").read_text()
    )


def test_export_command_rejects_bad_precision_and_target(capsys, tmp_path):
    from facefuse.cli import main

    for flag, value in (("--precision", "int4"), ("--target", "tpu")):
        with pytest.raises(SystemExit) as exc:
            main(["export", "--out", str(tmp_path), flag, value])
        assert exc.value.code == 2
        assert f"invalid choice: '{value}'" in capsys.readouterr().err
    assert main(["export", "--out", str(tmp_path), "--precision", "fp16"]) == 2
    assert "--precision fp16 is not built for --target cpu" in capsys.readouterr().out
    assert main(["export", "--out", str(tmp_path), "--target", "gpu", "--precision", "int8"]) == 2


def test_check_engines_command_reports_a_foreign_engine(tmp_path, capsys, monkeypatch):
    from facefuse.export import gpu

    from facefuse.cli import main

    plan = tmp_path / "unet" / "1" / gpu.PLAN_FILE
    plan.parent.mkdir(parents=True)
    plan.write_bytes(b"ftrt" + bytes(range(200)))
    built = gpu.EngineTarget("10.3.0", "NVIDIA A10G", "8.6")
    gpu.write_metadata(plan, built, gpu.unet_profile(16, 64, 768), fp16=True)
    here = gpu.EngineTarget("10.3.0", "NVIDIA H100 80GB HBM3", "9.0")
    monkeypatch.setattr(gpu, "host_target", lambda device=0: here)
    assert main(["export", "--out", str(tmp_path), "--check-engines"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "NVIDIA A10G (sm 8.6)" in out and "NVIDIA H100" in out and "model.plan" in out
    monkeypatch.setattr(gpu, "host_target", lambda device=0: built)
    assert main(["export", "--out", str(tmp_path), "--check-engines"]) == 0
    assert json.loads(gpu.metadata_path(plan).read_text())["fp16"] is True
