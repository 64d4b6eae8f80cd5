"""``facefuse face-eval DIR [--json] [--stages ...] [--min-rate R]``: measure face detection."""

from __future__ import annotations

import argparse
import json

from facefuse.face.detect import STAGE_NAMES


def _stages(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in names if s not in STAGE_NAMES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"choose a comma-separated list from {STAGE_NAMES}")
    return names


def register(subparsers) -> None:
    """Add the ``face-eval`` sub-command."""
    parser = subparsers.add_parser(
        "face-eval",
        help="detection rate and time per detector stage on a folder of images",
        description="Run the face detector cascade on every PNG/JPEG/WEBP in DIR and report "
        "how many faces were found and the mean milliseconds of each stage.",
    )
    parser.add_argument("dir", metavar="DIR", help="folder of images")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--stages",
        type=_stages,
        default=None,
        help=f"comma-separated cascade from {', '.join(STAGE_NAMES)} (default: best installed)",
    )
    parser.add_argument(
        "--min-rate",
        type=float,
        default=0.0,
        help="exit with status 1 when the detection rate is below this fraction",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Evaluate, print, and return 0 (or 1 when the rate is below ``--min-rate``)."""
    from facefuse.face.evaluate import evaluate_folder, format_report

    report = evaluate_folder(args.dir, args.stages)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(report))
    return 1 if report.rate < args.min_rate else 0
