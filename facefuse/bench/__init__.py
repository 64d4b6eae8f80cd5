"""``facefuse bench ...``: benchmarks that measure side by side in one run and print ratios.

Each module in ``BENCH_MODULES`` exposes ``register(subparsers)`` and adds one sub-command to
``facefuse bench`` (``text-encoder`` here; ``unet`` or ``e2e`` are added the same way as sibling
modules). Modules are imported only to register; torch is imported when a benchmark runs.
"""

from __future__ import annotations

import importlib

BENCH_MODULES = ("facefuse.bench.text_encoder", "facefuse.bench.unet", "facefuse.bench.e2e")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmarks (ratios measured side by side in one run)"
    )
    benches = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name in BENCH_MODULES:
        importlib.import_module(name).register(benches)
