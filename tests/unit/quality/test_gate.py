"""The fidelity gate: metrics, the gate on the tiny model for every CPU variant, failure paths."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from facefuse.quality.metrics import PSNR_CAP_DB, max_abs_diff, psnr, ssim

GATE_STEPS = 6  # strength 0.5: 3 UNet calls per fusion, 6 for txt2img; same for both variants


def test_psnr_matches_its_definition():
    rng = np.random.default_rng(0)
    a = rng.random((32, 32, 3))
    b = np.clip(a + 0.01 * np.sign(rng.standard_normal(a.shape)), 0, 1)
    mse = np.mean((a - b) ** 2)
    assert psnr(a, b) == pytest.approx(10 * np.log10(1.0 / mse), abs=1e-9)
    assert psnr(a, a) == PSNR_CAP_DB
    assert psnr(a, b) < psnr(a, (a + b) / 2)


def test_ssim_is_one_for_identical_and_drops_with_noise():
    rng = np.random.default_rng(1)
    a = rng.random((48, 48, 3))
    assert ssim(a, a) == pytest.approx(1.0)
    noisy = np.clip(a + 0.2 * rng.standard_normal(a.shape), 0, 1)
    assert ssim(a, noisy) < 0.9
    with pytest.raises(ValueError, match="shape"):
        ssim(a, a[:40])
    with pytest.raises(ValueError, match="NaN"):
        psnr(a, np.full_like(a, np.nan))
    assert max_abs_diff(a, a + 0.5) == pytest.approx(0.5)


@pytest.fixture(scope="module")
def int8_repository(tiny_repository):
    """The session's tiny repository with its INT8 variant exported into it."""
    from facefuse.export.quantize import export_cpu_variant

    results = export_cpu_variant(tiny_repository, "int8")
    assert [r.path.parent.parent.name for r in results] == ["unet", "unet_deep", "unet_shallow"]
    assert {r.path.name for r in results} == {"model.int8.onnx"}
    return tiny_repository


def test_int8_passes_the_32db_gate_on_the_tiny_model(int8_repository):
    """CI gate: every CPU variant against fp32, fixed inputs/seeds/latents, same steps."""
    from facefuse.quality.gate import fixed_cases, run_gate

    cases = fixed_cases()
    chosen = [cases[0], cases[-1]]  # the sample pair + txt2img (pure-noise latents)
    report = run_gate(int8_repository, "fp32", "int8", 32.0, GATE_STEPS, cases=chosen)
    assert [c.name for c in report.cases] == [c.name for c in chosen]
    assert report.passed, report.to_dict()
    for case in report.cases:
        assert case.max_abs_conditioning == 0.0  # the INT8 variant leaves the text encoder
        assert case.max_abs_latents > 0.0  # ... but really runs another UNet
        assert 32.0 <= case.psnr_db < PSNR_CAP_DB and case.ssim > 0.95


def test_fp32_against_itself_is_exact(int8_repository):
    from facefuse.quality.gate import fixed_cases, run_gate

    report = run_gate(int8_repository, "fp32", "fp32", steps=4, cases=fixed_cases()[:1])
    (case,) = report.cases
    assert case.psnr_db == PSNR_CAP_DB and case.max_abs_latents == 0.0 and report.passed


def test_gate_prices_cfg_truncation_against_full_guidance(int8_repository):
    """Same precision, candidate truncated: only the guidance differs, and the gate sees it."""
    from facefuse.quality.gate import fixed_cases, run_gate

    report = run_gate(
        int8_repository,
        "fp32",
        "fp32",
        steps=8,
        cases=fixed_cases()[:1],
        candidate_cfg_truncation=0.5,
    )
    (case,) = report.cases
    assert report.to_dict()["candidate_cfg_truncation"] == 0.5
    assert case.max_abs_conditioning == 0.0 and case.max_abs_latents > 0.0
    assert case.psnr_db < PSNR_CAP_DB


def test_gate_runs_the_inverted_default_and_sees_the_candidate(int8_repository):
    """With ``inversion`` both sides start from the composite's DDIM inversion: fp32 against
    itself stays exact, INT8 differs (its error enters the inversion and the denoising)."""
    from facefuse.quality.gate import fixed_cases, run_gate

    case = fixed_cases()[:1]
    same = run_gate(int8_repository, "fp32", "fp32", steps=4, scheduler="ddim", cases=case,
                    inversion=True)  # fmt: skip
    assert same.cases[0].psnr_db == PSNR_CAP_DB and same.cases[0].max_abs_latents == 0.0
    int8 = run_gate(int8_repository, "fp32", "int8", steps=4, scheduler="ddim", cases=case,
                    inversion=True)  # fmt: skip
    assert 0.0 < int8.cases[0].max_abs_latents and int8.cases[0].psnr_db < PSNR_CAP_DB


def test_gate_command_refuses_inversion_without_ddim(capsys):
    from facefuse.cli import main

    assert main(["quality", "--inversion"]) == 2
    assert "--inversion: needs --scheduler ddim, got dpm++" in capsys.readouterr().err


def test_gate_command_rejects_cfg_truncation_out_of_range(capsys):
    from facefuse.cli import main

    assert main(["quality", "--cfg-truncation", "1.5"]) == 2
    assert "--cfg-truncation" in capsys.readouterr().err


def _perturbed_repository(source, destination, scale):
    """A copy whose int8 file is the fp32 UNet with noisy weights: a variant that is wrong."""
    import onnx
    from onnx import numpy_helper

    repo = shutil.copytree(source, destination, ignore=shutil.ignore_patterns("*.int8.onnx"))
    model = onnx.load(str(repo / "unet" / "1" / "model.onnx"))
    rng = np.random.default_rng(0)
    for init in model.graph.initializer:
        weights = numpy_helper.to_array(init)
        if weights.dtype == np.float32 and weights.ndim == 4:  # conv kernels
            noisy = weights + scale * weights.std() * rng.standard_normal(weights.shape)
            init.CopyFrom(numpy_helper.from_array(noisy.astype(np.float32), init.name))
    onnx.save(model, str(repo / "unet" / "1" / "model.int8.onnx"))
    return repo


def test_gate_command_fails_under_threshold_and_names_missing_files(
    int8_repository, tmp_path, capsys
):
    from facefuse.cli import main

    bad = _perturbed_repository(int8_repository, tmp_path / "bad", scale=0.5)
    argv = ["quality", "--repository", str(bad), "--candidate", "int8", "--steps", "4"]
    assert main([*argv, "--cases", "1"]) == 1
    assert "FAIL: min PSNR" in capsys.readouterr().out
    (bad / "unet" / "1" / "model.int8.onnx").unlink()
    assert main(argv) == 2  # ModelLoadError naming the file
    assert "unet/1/model.int8.onnx: ONNX file not found" in capsys.readouterr().err


def test_gate_command_rejects_unknown_variant(capsys):
    from facefuse.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["quality", "--candidate", "int4"])
    assert exc.value.code == 2
    assert "invalid choice: 'int4'" in capsys.readouterr().err


def test_gate_prices_rows_batched_beside_the_candidate(int8_repository):
    """Extra rows beside every UNet call change nothing in fp32 (rows are independent) but move
    the dynamic INT8 graph's rows (one activation scale per tensor); INT8 still passes 32 dB."""
    from facefuse.quality.gate import fixed_cases, run_gate

    case = fixed_cases()[:1]
    fp32 = run_gate(int8_repository, "fp32", "fp32", steps=4, cases=case, candidate_batched_rows=6)
    assert fp32.cases[0].max_abs_latents == 0.0
    alone, batched = (
        run_gate(int8_repository, "fp32", "int8", 32.0, 4, cases=case, candidate_batched_rows=rows)
        for rows in (0, 6)
    )
    assert batched.to_dict()["candidate_batched_rows"] == 6
    assert batched.cases[0].max_abs_latents != alone.cases[0].max_abs_latents
    assert batched.passed, batched.to_dict()


def test_gate_command_rejects_negative_batched_rows(capsys):
    from facefuse.cli import main

    assert main(["quality", "--batched-with", "-1"]) == 2
    assert "--batched-with" in capsys.readouterr().err


def test_gate_prices_the_vaes_on_openvino(int8_repository, capsys):
    """fp32 against fp32 with the VAEs on OpenVINO bf16 (the served CPU default): the init
    latents and the image differ from ORT's, and the gate still passes 32 dB."""
    pytest.importorskip("openvino")
    from facefuse.cli import main

    argv = ["quality", "--repository", str(int8_repository), "--candidate", "fp32"]
    assert (
        main(
            [
                *argv,
                "--steps",
                "4",
                "--cases",
                "1",
                "--json",
                "--candidate-openvino",
                "vae_encoder,vae_decoder",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    report = json.loads(out.out)
    (case,) = report["cases"]
    assert case["max_abs_init_latents"] > 0.0 and case["max_abs_conditioning"] == 0.0
    assert 32.0 <= case["psnr_db"] <= PSNR_CAP_DB
    from facefuse.runtime.openvino import native_bf16

    if native_bf16():  # bf16 rounds the image; a CPU without BF16 runs f32 and may not
        assert case["psnr_db"] < PSNR_CAP_DB
    assert "vae_encoder, vae_decoder on OpenVINO bf16" in out.err
    assert main([*argv, "--candidate-openvino", "vae"]) == 2
    assert "--candidate-openvino" in capsys.readouterr().err
