"""``facefuse export``: build ONNX artefacts into a Triton model repository."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

PRECISIONS = ("fp32",)
TARGETS = ("cpu",)


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
        default="tiny",
        help="'tiny' (the seeded tiny SD 1.x model, built on first use into .cache/models/tiny) "
        "or the path of a local diffusers SD 1.x folder (e.g. stable-diffusion-v1-5)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("model_repository"),
        help="model repository to write into (default: model_repository)",
    )
    parser.add_argument(
        "--precision", choices=PRECISIONS, default="fp32", help="weight precision of the graphs"
    )
    parser.add_argument(
        "--target", choices=TARGETS, default="cpu", help="hardware the artefacts are built for"
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
    started = time.perf_counter()
    with console.status(f"loading {args.model}") as status:
        components = load_components(args.model)
        results = export_repository(
            components, args.out, progress=lambda step: status.update(f"exporting {step}")
        )
    table = Table(title=f"ONNX export of {components.path} -> {args.out}")
    for column in ("graph", "file", "max |onnx - torch|", "output scale", "check"):
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
    console.print(f"export took {time.perf_counter() - started:.1f} s")
    return 0 if all(r.ok for r in results) else 1
