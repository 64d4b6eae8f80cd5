"""``facefuse bench ...``: benchmarks that measure side by side in one run and print ratios.

Each module in ``BENCH_MODULES`` exposes ``register(subparsers)`` and adds one sub-command to
``facefuse bench`` (``text-encoder`` here; ``unet`` or ``e2e`` are added the same way as sibling
modules). Modules are imported only to register; torch is imported when a benchmark runs.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable

BENCH_MODULES = (
    "facefuse.bench.text_encoder",
    "facefuse.bench.unet",
    "facefuse.bench.e2e",
    "facefuse.bench.gpu",
    "facefuse.bench.report",
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmarks (ratios measured side by side in one run)"
    )
    benches = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name in BENCH_MODULES:
        importlib.import_module(name).register(benches)


def progress_log(as_json: bool) -> Callable[[str], None]:
    """Progress lines go to stdout, or to stderr when stdout carries the JSON report."""

    def log(message: str) -> None:
        print(message, file=sys.stderr if as_json else sys.stdout, flush=True)

    return log


def print_report(report: dict, as_json: bool) -> None:
    """The whole report as JSON, or its ``verdict`` lines."""
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        for line in report["verdict"]:
            print(line)
