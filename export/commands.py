"""``facefuse export``: build ONNX artefacts into a Triton model repository."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from facefuse.runtime.variants import PRECISIONS, TARGETS

# what each target can build (fp32, the reference, is always exported)
TARGET_PRECISIONS = {"cpu": ("fp32", "int8"), "gpu": ("fp32", "fp16")}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export text encoder, UNet and VAE to ONNX into a Triton model repository",
        description=(
            "Export the text encoder, UNet, VAE encoder and VAE decoder of an SD 1.x model to "
            "ONNX (dynamic batch axis), check each against PyTorch on the same input (max abs "
            "difference printed and bounded), and write them with the pipeline manifest and "
            "tokenizer into the model repository."
        ),
    )
    parser.add_argument(
        "--model",
        default="faces",
        help="'faces' (the default: the trained face model shipped in the package, 128 px, "
        "TAEF2 latents), 'tiny' (the seeded tiny SD 1.x model with random weights, for fast "
        "tests, built on first use into .cache/models/tiny), "
        "'mid' (a seeded mid-size model whose UNet dominates the cost) "
        "or the path of a local diffusers SD 1.x folder (e.g. stable-diffusion-v1-5)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("model_repository"),
        help="model repository to write into (default: model_repository)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="variant written beside the fp32 reference: int8 (cpu: unet model.int8.onnx, dynamic "
        "MatMul/Gemm; always written, it is what the CPU config serves) or fp16 (gpu: "
        "model.fp16.onnx + TensorRT model.plan)",
    )
    parser.add_argument(
        "--target", choices=TARGETS, default="cpu", help="hardware the artefacts are built for"
    )
    parser.add_argument(
        "--variant-models",
        action="store_true",
        help="also generate <model>_<precision> folders (A/B candidate: `candidate_variant`) "
        "and, for --target gpu, <model>_fp32 folders (FP32 fallback: `fallback_margin_mb`); "
        "Triton loads every folder, so each costs its memory even when unused",
    )
    parser.add_argument(
        "--no-engine",
        action="store_true",
        help="gpu: write FP16 ONNX only, no TensorRT engine (e.g. on a host without TensorRT)",
    )
    parser.add_argument(
        "--check-engines",
        action="store_true",
        help="only check the TensorRT engines in --out against this host's GPU and TensorRT",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from facefuse.export.repository import export_repository
    from rich.console import Console
    from rich.table import Table

    from facefuse.models.loading import load_components

    console = Console()
    if not args.out.is_dir():
        console.print(f"[red]--out {args.out}: not a directory (expected the model repository)")
        return 2
    if args.check_engines:
        return _check_engines(args.out, console)
    if args.precision not in TARGET_PRECISIONS[args.target]:
        console.print(
            f"[red]--precision {args.precision} is not built for --target {args.target} "
            f"(choose from {', '.join(TARGET_PRECISIONS[args.target])})"
        )
        return 2
    started = time.perf_counter()
    with console.status(f"loading {args.model}") as status:
        components = load_components(args.model)
        results = export_repository(
            components, args.out, progress=lambda step: status.update(f"exporting {step}")
        )
    table = Table(
        title=f"ONNX export of {components.path} -> {args.out}",
        caption="max |diff|: ONNX vs PyTorch on the same inputs; the fused UNet vs model.onnx",
    )
    for column in ("graph", "file", "max |diff|", "output scale", "check"):
        table.add_column(column)
    for r in results:
        table.add_row(
            r.name,
            str(r.path.relative_to(args.out)),
            f"{r.max_abs_diff:.2e}",
            f"{r.output_scale:.2f}",
            "ok" if r.ok else "[red]FAIL",
        )
    console.print(table)
    if all(r.ok for r in results) and args.precision != "fp32":
        _export_variant(args, components, console)
    console.print(f"export took {time.perf_counter() - started:.1f} s")
    return 0 if all(r.ok for r in results) else 1


def _export_variant(args, components, console) -> None:
    """Write the --precision variant beside model.onnx, and its A/B / fallback folders."""
    from facefuse.export.repository import write_variant_models

    if args.target == "cpu":
        pass  # the INT8 UNet is written by export_repository: it is the CPU default
    else:
        from facefuse.export.gpu import export_gpu_variant

        from facefuse.diffusion.manifest import MANIFEST_NAME, PipelineManifest

        manifest = PipelineManifest.load(args.out / "facefusion" / "1" / MANIFEST_NAME)
        for r in export_gpu_variant(
            args.out, args.precision, manifest, {"unet": 16}, engines=not args.no_engine
        ):
            console.print(f"{r.kind}: {r.path.relative_to(args.out)} ({r.detail})")
    if not args.variant_models:
        return
    generated = write_variant_models(args.out, args.precision)
    if args.target == "gpu":
        generated += write_variant_models(args.out, "fp32")  # the FP32 fallback models
    for folder in generated:
        console.print(f"variant model folder: {folder.relative_to(args.out)}")


def _check_engines(out: Path, console) -> int:
    from facefuse.export.gpu import PLAN_FILE, check_engine

    from facefuse.core.errors import ModelLoadError

    plans = sorted(out.glob(f"*/1/{PLAN_FILE}"))
    if not plans:
        console.print(f"[red]no TensorRT engine ({PLAN_FILE}) under {out}")
        return 1
    failed = 0
    for plan in plans:
        try:
            meta = check_engine(plan)
            console.print(f"{plan}: ok (TensorRT {meta['tensorrt_version']}, {meta['gpu_name']})")
        except ModelLoadError as exc:
            console.print(f"[red]{exc}")
            failed += 1
    return 1 if failed else 0
