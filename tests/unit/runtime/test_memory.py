"""FP32 fallback and CPU memory refusal, driven by simulated memory readings."""

from __future__ import annotations

import pytest

from facefuse.core.errors import ModelLoadError
from facefuse.runtime.memory import (
    ACTIVATION_ALLOWANCE,
    MIB,
    WEIGHT_FACTOR,
    FallbackController,
    MemoryReading,
    check_cpu_fits,
    cpu_available,
    decide_gpu_variant,
    estimate_working_set,
    is_oom,
    weight_bytes,
)


def _meminfo(tmp_path, available_kb: int):
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal: 24000000 kB\nMemFree: 1000 kB\nMemAvailable: {available_kb} kB\n")
    return path


def test_cpu_available_reads_meminfo_and_respects_a_cgroup_limit(tmp_path):
    meminfo = _meminfo(tmp_path, 8_000_000)
    no_cgroup = cpu_available(meminfo, tmp_path / "none")
    assert no_cgroup == MemoryReading(8_000_000 * 1024, "MemAvailable")
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text(str(100 * MIB))
    assert cpu_available(meminfo, cgroup).source == "MemAvailable"
    (cgroup / "memory.max").write_text(str(2048 * MIB))
    limited = cpu_available(meminfo, cgroup)
    assert limited.free_bytes == 1948 * MIB and "cgroup" in limited.source


def test_weight_bytes_counts_external_data_in_both_layouts(tmp_path):
    single = tmp_path / "a" / "model.onnx"
    single.parent.mkdir()
    single.write_bytes(b"x" * 100)
    (single.parent / "model.onnx.data").write_bytes(b"x" * 5000)
    (single.parent / "model.py").write_text("# code is not weights\n" * 50)
    assert weight_bytes(single) == 5100
    scattered = tmp_path / "b" / "model.onnx"  # torch's exporter: one file per tensor
    scattered.parent.mkdir()
    scattered.write_bytes(b"x" * 100)
    for name in ("model.conv_in.weight", "onnx__MatMul_123"):
        (scattered.parent / name).write_bytes(b"x" * 1000)
    (scattered.parent / "model.int8.onnx").write_bytes(b"x" * 700)  # another variant
    assert weight_bytes(scattered) == 2100
    assert estimate_working_set(single) == int(WEIGHT_FACTOR * 5100) + ACTIVATION_ALLOWANCE


def test_cpu_refuses_a_variant_that_does_not_fit(tmp_path):
    graph = tmp_path / "model.onnx"
    graph.write_bytes(b"x" * (64 * MIB))
    needed = estimate_working_set(graph)
    assert check_cpu_fits(graph, MemoryReading(needed + MIB, "test")) == needed
    with pytest.raises(ModelLoadError) as exc:
        check_cpu_fits(graph, MemoryReading(needed - MIB, "MemAvailable"))
    message = str(exc.value)
    assert str(graph) in message and "exceeds" in message and "MemAvailable" in message
    assert f"{needed / MIB:.0f} MiB" in message
    with pytest.raises(ModelLoadError, match="not found"):
        check_cpu_fits(tmp_path / "missing.onnx", MemoryReading(1 << 40, "test"))


def test_gpu_decision_from_simulated_readings():
    margin = 2048 * MIB
    low = decide_gpu_variant("fp16", MemoryReading(1500 * MIB, "NVML"), margin)
    assert low.variant == "fp32" and low.fallback
    assert "1500 MiB" in low.reason and "2048 MiB" in low.reason and "NVML" in low.reason
    ok = decide_gpu_variant("fp16", MemoryReading(6000 * MIB, "NVML"), margin)
    assert ok.variant == "fp16" and not ok.fallback
    edge = decide_gpu_variant("fp16", MemoryReading(margin, "NVML"), margin)
    assert edge.variant == "fp16"
    unknown = decide_gpu_variant("fp16", None, margin)
    assert unknown.variant == "fp16" and "unknown" in unknown.reason
    assert decide_gpu_variant("fp16", MemoryReading(0, "x"), 0).variant == "fp16"
    assert not decide_gpu_variant("fp32", MemoryReading(0, "x"), margin).fallback


@pytest.mark.parametrize(
    ("message", "oom"),
    [
        ("call to model 'unet' failed: CUDA out of memory. Tried to allocate 2.00 GiB", True),
        ("[TensorRT] ERROR: CUDA_ERROR_OUT_OF_MEMORY", True),
        ("onnxruntime: Failed to allocate memory for requested buffer of size 1234", True),
        ("std::bad_alloc", True),
        ("call to model 'unet' failed: sample: expected 4 channels", False),
        ("zoom factor out of range", False),
    ],
)
def test_oom_detection(message, oom):
    assert is_oom(message) is oom
    assert is_oom(RuntimeError(message)) is oom


def test_fallback_controller_switches_once_and_reports():
    reports = []
    controller = FallbackController("fp16", report=lambda *a: reports.append(a))
    assert not controller.on_error(ValueError("bad input"))
    assert controller.variant == "fp16" and not reports
    assert controller.on_error(RuntimeError("CUDA out of memory"))
    assert controller.variant == "fp32" and controller.fell_back
    assert reports[0][:2] == ("fp16", "fp32") and reports[0][3] == "run"
    assert not controller.on_error(MemoryError())  # already on fp32: the error propagates
    assert len(reports) == 1

    at_load = FallbackController("fp16", report=lambda *a: reports.append(a))
    decision = at_load.at_load(MemoryReading(100 * MIB, "NVML"), 2048 * MIB)
    assert decision.fallback and at_load.variant == "fp32" and reports[-1][3] == "load"
    stays = FallbackController("fp16")
    assert not stays.at_load(MemoryReading(8192 * MIB, "NVML"), 2048 * MIB).fallback
    assert stays.variant == "fp16"
