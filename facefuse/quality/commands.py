"""``facefuse quality``: the fidelity gate of a precision variant against the fp32 reference."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from facefuse.diffusion.loop import SCHEDULERS
from facefuse.runtime.openvino import PRECISIONS as OPENVINO_PRECISIONS
from facefuse.runtime.variants import ONNX_MODELS, PRECISIONS


def register(subparsers) -> None:
    from facefuse.quality.gate import DEFAULT_STEPS, DEFAULT_THRESHOLD_DB

    parser = subparsers.add_parser(
        "quality",
        help="fidelity gate: PSNR/SSIM of a precision variant against the fp32 reference",
        description=(
            "Run fixed inputs (sample photos and variations, fixed seeds and initial latents, "
            "same steps) through the reference and the candidate variant of a repository "
            "in-process, report PSNR and SSIM of the images and max abs differences of "
            "conditioning and latents; exit 1 when the lowest PSNR is under --threshold."
        ),
    )
    parser.add_argument("--reference", choices=PRECISIONS, default="fp32")
    parser.add_argument("--candidate", choices=PRECISIONS, default="int8")
    parser.add_argument(
        "--repository",
        type=Path,
        default=Path("model_repository"),
        help="exported model repository holding both variants (default: model_repository)",
    )
    parser.add_argument(
        "--threshold", type=float, default=DEFAULT_THRESHOLD_DB, help="minimum PSNR in dB"
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="denoising steps")
    parser.add_argument("--scheduler", default="dpm++", choices=SCHEDULERS)
    parser.add_argument(
        "--inversion",
        action="store_true",
        help="start fusions from the composite's DDIM inversion, as the served default does "
        "(needs --scheduler ddim)",
    )
    parser.add_argument("--cases", type=int, default=0, help="run only the first N cases")
    parser.add_argument(
        "--cfg-truncation",
        type=float,
        default=0.0,
        help="run the candidate with guidance skipped for this last fraction of steps",
    )
    parser.add_argument(
        "--batched-with",
        type=int,
        default=0,
        metavar="ROWS",
        help="run every candidate UNet call with ROWS other rows beside it, as under dynamic "
        "batching (6: a batch of 8)",
    )
    parser.add_argument(
        "--candidate-openvino",
        default="",
        metavar="MODELS",
        help="run these candidate graphs (comma-separated, e.g. vae_encoder,vae_decoder) on "
        "OpenVINO at --openvino-precision; the reference stays on ONNX Runtime",
    )
    parser.add_argument("--openvino-precision", default="bf16", choices=OPENVINO_PRECISIONS)
    parser.add_argument("--threads", type=int, default=0, help="ORT intra-op threads")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from facefuse.core.errors import InvalidInput
    from facefuse.quality.gate import fixed_cases, run_gate

    if not 1 <= args.steps <= 100:
        raise InvalidInput("--steps", f"must be in 1..100, got {args.steps}")
    if not 0.0 <= args.cfg_truncation <= 1.0:
        raise InvalidInput("--cfg-truncation", f"must be in [0, 1], got {args.cfg_truncation}")
    if not 0 <= args.batched_with <= 64:
        raise InvalidInput("--batched-with", f"must be in 0..64 rows, got {args.batched_with}")
    if args.cases < 0:
        raise InvalidInput("--cases", f"must be >= 0, got {args.cases}")
    if args.inversion and args.scheduler != "ddim":
        raise InvalidInput("--inversion", f"needs --scheduler ddim, got {args.scheduler}")
    openvino = [m.strip() for m in args.candidate_openvino.split(",") if m.strip()]
    unknown = sorted(set(openvino) - set(ONNX_MODELS))
    if unknown:
        raise InvalidInput(
            "--candidate-openvino", f"models must be among {ONNX_MODELS}, got {unknown}"
        )
    runtimes = {m: ("openvino", args.openvino_precision) for m in openvino}
    cases = fixed_cases()
    if args.cases:
        cases = cases[: args.cases]

    def log(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    levers = f" (CFG truncated for the last {args.cfg_truncation:g})" if args.cfg_truncation else ""
    if args.inversion:
        levers += " (inverted)"
    if args.batched_with:
        levers += f" (batched with {args.batched_with} other rows)"
    if openvino:
        levers += f" ({', '.join(openvino)} on OpenVINO {args.openvino_precision})"
    log(f"fidelity gate: {args.candidate}{levers} vs {args.reference} on {args.repository}")
    report = run_gate(
        args.repository,
        reference=args.reference,
        candidate=args.candidate,
        threshold_db=args.threshold,
        steps=args.steps,
        scheduler=args.scheduler,
        cases=cases,
        intra_op_threads=args.threads,
        log=log,
        candidate_cfg_truncation=args.cfg_truncation,
        candidate_batched_rows=args.batched_with,
        candidate_runtimes=runtimes,
        inversion=args.inversion,
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    verdict = "PASS" if report.passed else "FAIL"
    log(
        f"{verdict}: min PSNR {report.min_psnr_db:.2f} dB (threshold {args.threshold:g} dB), "
        f"min SSIM {report.min_ssim:.4f}, {len(report.cases)} cases, {args.steps} steps"
    )
    return 0 if report.passed else 1
