"""``facefuse fusion-eval``: identity, expression and background figures of the served fusion.

See :mod:`facefuse.quality.fusion_eval` for what is measured and how.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DEFAULT_SIZE = 512


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "fusion-eval",
        help="fuse every (A, B) pair of two folders through the served model and report "
        "identity (dlib descriptors), the smile instruction's effect and B's PSNR outside "
        "the face, against the paste-only composite",
        description=(
            "Fuse every pair (A from --sources, B from --targets, different file stems) "
            "through the served facefusion model with 'make them smile' and 'keep a neutral "
            "expression' (same seed), and composite it locally without diffusion. Reports "
            "whether a face is found where B's was (dlib HOG, IoU >= 0.5), the 128-d "
            "descriptor distance to A and to B, mouth width / outer-eye span (68 points) "
            "smile vs neutral, PSNR of B outside the face mask, and the request latency; "
            "writes report.json and contact_sheet.png to --out. Without --url a local "
            "tritonserver is started on --repository. dlib's 68-point model is used here "
            "for evaluation only."
        ),
    )
    parser.add_argument("--sources", type=Path, required=True, help="folder of A photos")
    parser.add_argument("--targets", type=Path, required=True, help="folder of B photos")
    parser.add_argument(
        "--repository",
        type=Path,
        default=Path("model_repository"),
        help="model repository to serve (default model_repository); also gives the crop "
        "size of the paste-only composite",
    )
    parser.add_argument(
        "--url", default=None, help="gRPC host:port of a running server instead of starting one"
    )
    ids = parser.add_mutually_exclusive_group()
    ids.add_argument("--ids", default=None, help="comma-separated IDs (file stems) to use")
    ids.add_argument("--ids-file", type=Path, default=None, help="file of IDs, one a line")
    parser.add_argument(
        "--pairs", type=int, default=None, help="use N pairs drawn with --seed (default all)"
    )
    parser.add_argument("--seed", type=int, default=0, help="request seed and pair draw")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("reports/fusion-eval"),
        help="folder for report.json, contact_sheet.png and the server log",
    )
    parser.add_argument("--strength", type=float, default=None, help="0.05..1 (server default)")
    parser.add_argument("--steps", type=int, default=None, help="1..100 (server default)")
    parser.add_argument("--guidance", type=float, default=None, help="1..30 (server default)")
    parser.add_argument(
        "--size",
        type=int,
        default=None,
        help="crop size of the paste-only composite (default: the repository's pipeline.json "
        f"image_size, else {DEFAULT_SIZE})",
    )
    parser.add_argument(
        "--smiling",
        type=Path,
        default=None,
        help="folder of the --sources people smiling (same file stems), e.g. "
        "faces-london/smiling: also report the expression measure on the photos themselves",
    )
    parser.add_argument("--sheet-rows", type=int, default=8, help="pairs on the contact sheet")
    parser.add_argument("--timeout", type=float, default=600.0, help="request timeout, seconds")
    parser.set_defaults(func=run)
    register_expression(subparsers)


def register_expression(subparsers) -> None:
    parser = subparsers.add_parser(
        "expression-eval",
        help="judge whose expression the served fusion wears and the smile / neutral edits on "
        "London people (their own smiling photo is the measure)",
        description=(
            "For pairs of different London people (A, B): A neutral onto B smiling and A "
            "smiling onto B neutral with nothing asked, 'make them smile' (and slight / big) on "
            "a neutral B, 'keep a neutral expression' on a smiling B, through the served "
            "facefusion model. Reports each output's share of A's own smile (dlib 68: mouth "
            "width over outer-eye span and the corners' rise over the lips' middle, from A's "
            "neutral to A's smiling photo), descriptor distance to A's photo of the same "
            "expression and to B, face found, B's PSNR outside the face and latency; writes "
            "report.json and a contact sheet. Without --url a local tritonserver is started "
            "on --repository; --in-process runs the repository's ONNX files in this process."
        ),
    )
    parser.add_argument("--london", type=Path, required=True,
                        help="folder with neutral/ID.jpg and smiling/ID.jpg")  # fmt: skip
    ids = parser.add_mutually_exclusive_group(required=True)
    ids.add_argument("--ids", default=None, help="comma-separated IDs")
    ids.add_argument("--ids-file", type=Path, default=None, help="file of IDs, one a line")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--url", default=None, help="gRPC host:port of a running server")
    parser.add_argument("--in-process", action="store_true",
                        help="no server: the repository's pipeline in this process")  # fmt: skip
    parser.add_argument("--pairs", type=int, default=None, help="pairs (default: one per ID)")
    parser.add_argument("--seed", type=int, default=1, help="pair draw")
    parser.add_argument("--cases", default=None,
                        help="comma-separated cases (default: the six core cases; "
                             "'phrasings': the smile paraphrases and negations, EN and ZH, "
                             "with make_smile)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("reports/expression-eval"))
    parser.add_argument("--sheet", type=Path, default=None,
                        help="also write the contact sheet here")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.set_defaults(func=run_expression)


def run_expression(args: argparse.Namespace) -> int:
    from PIL import Image

    from facefuse.core.errors import InvalidInput
    from facefuse.quality.fusion_eval import (
        CASE_TITLES,
        CORE_CASES,
        EXPRESSION_CASES,
        PHRASING_CASES,
        FaceMeter,
        evaluate_expression,
        to_json,
    )

    ids = _ids(args)
    for kind in ("neutral", "smiling"):
        if not (args.london / kind).is_dir():
            raise InvalidInput("--london", f"needs {kind}/ID.jpg photos: {args.london / kind}")
    cases: tuple[str, ...] = CORE_CASES
    if args.cases is not None:
        cases = ()
        for name in args.cases.split(","):  # "phrasings": every phrasing case, with make_smile
            cases += ("make_smile", *PHRASING_CASES) if name == "phrasings" else (name,)
        cases = tuple(dict.fromkeys(cases))
    unknown = [c for c in cases if c not in EXPRESSION_CASES]
    if unknown:
        raise InvalidInput("--cases", f"unknown {unknown}; choose from {list(EXPRESSION_CASES)}")
    if args.pairs is not None and args.pairs < 1:
        raise InvalidInput("--pairs", f"must be at least 1, got {args.pairs}")
    if args.url is None and not args.repository.is_dir():
        raise InvalidInput("--repository", f"must be a model repository folder: {args.repository}")
    args.size = None
    size = _size(args)
    meter = FaceMeter()
    started = time.perf_counter()

    def log(line: str) -> None:
        print(line, flush=True)

    def run_with(fuse) -> tuple[dict, object]:
        return evaluate_expression(
            args.london, ids, fuse, args.pairs, args.seed, size, cases, meter, log
        )

    if args.in_process:
        from facefuse.bench.e2e import in_process_pipeline
        from facefuse.diffusion.pipeline import params_from

        pipeline = in_process_pipeline(args.repository)
        params = params_from(steps=pipeline.default_steps, strength=pipeline.default_strength)
        report, sheet = run_with(lambda a, b, text: pipeline.fuse_png(a, b, text, params))
        where = f"in process on {args.repository}"
    else:
        from facefuse.client import Client

        def served(url: str):
            with Client(url, "grpc", args.timeout) as client:

                def fuse(a: bytes, b: bytes, text: str):
                    result = client.fuse(a, b, text)
                    return result.png, result.info

                return run_with(fuse)

        from facefuse.serving.server import served_url

        log_path = args.out / "tritonserver.log"
        with served_url(args.repository, args.url, log_path) as (url, where):
            report, sheet = served(url)
    report["config"]["server"] = where
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(to_json(report), indent=2) + "\n")
    if sheet is not None:
        Image.fromarray(sheet).save(args.out / "contact_sheet.png")
        if args.sheet is not None:
            args.sheet.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(sheet).save(args.sheet)
    summary = to_json(report)["summary"]
    for case in cases:
        s = summary[case]
        print(
            f"{CASE_TITLES[case]}: n {s['n']}, own smile median {s['smile_share_median']} "
            f"(>= 40%: {s['smile_share_at_least_40']}), corner rise {s['rise_share_median']}, "
            f"d(A same) {s['median_distance_a_same']}, nearer A {s['nearer_a_share']}, "
            f"found {s['face_found_share']}, PSNR out min {s['psnr_outside_min_db']}, "
            f"latency {s['latency_ms_median']} ms"
        )
    print(f"ordering: {to_json(report)['ordering']}")
    if report.get("phrasings"):
        print(f"phrasings: {to_json(report)['phrasings']}")
    print(f"wrote {args.out / 'report.json'}")
    return 0


def _size(args) -> int:
    from facefuse.core.errors import InvalidInput

    if args.size is not None:
        if not 8 <= args.size <= 2048:
            raise InvalidInput("--size", f"must be in 8..2048, got {args.size}")
        return args.size
    manifest = args.repository / "facefusion" / "1" / "pipeline.json"
    if manifest.is_file():
        from facefuse.diffusion.manifest import PipelineManifest

        return PipelineManifest.load(manifest).image_size
    return DEFAULT_SIZE


def _ids(args) -> list[str] | None:
    from facefuse.core.errors import InvalidInput
    from facefuse.quality.fusion_eval import parse_ids

    if args.ids_file is not None:
        if not args.ids_file.is_file():
            raise InvalidInput("--ids-file", f"file not found: {args.ids_file}")
        ids = parse_ids(args.ids_file.read_text())
        field_name = "--ids-file"
    elif args.ids is not None:
        ids, field_name = parse_ids(args.ids), "--ids"
    else:
        return None
    if len(ids) < 2:
        raise InvalidInput(field_name, f"must name at least two people, got {ids}")
    return ids


def _print_summary(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    s = report["summary"]

    def fmt(value, pattern="{:.3f}"):
        return "-" if value is None else pattern.format(value)

    table = Table(title=f"fusion-eval: {s['evaluated']} of {s['pairs']} pairs evaluated")
    for name in ("", "face found", "nearer A", "med d(A)", "med d(B)", "PSNR out min", "med"):
        table.add_column(name, justify="right" if name else "left", no_wrap=not name)
    for variant in ("paste_only", "neutral", "smile"):
        v = s[variant]
        table.add_row(
            variant.replace("_", "-"),
            fmt(v["face_found_share"], "{:.0%}"),
            fmt(v["nearer_a_share"], "{:.0%}"),
            fmt(v["median_distance_a"]),
            fmt(v["median_distance_b"]),
            fmt(v["psnr_outside_min_db"], "{:.1f} dB"),
            fmt(v["psnr_outside_median_db"], "{:.1f} dB"),
        )
    console = Console()
    console.print(table)
    effect = s["instruction_effect"]
    console.print(
        f"smile vs neutral (mouth / outer-eye span): wider in "
        f"{fmt(effect['smile_wider_share'], '{:.0%}')} of {effect['n']} pairs, median ratio "
        f"{fmt(effect['median_smile_over_neutral'])}"
    )
    check = report.get("expression_check")
    if check:
        console.print(
            f"measure on the photos (smiling vs neutral): separates {check['separated']} of "
            f"{check['people']} people, median ratio "
            f"{fmt(check['median_smiling_over_neutral'])}; not separated: "
            f"{', '.join(check['not_separated']) or '-'}; no face: "
            f"{', '.join(check['no_face']) or '-'}"
        )
    per_pair = fmt(s["seconds_per_pair_median"], "{:.1f} s")
    latency = fmt(s["latency_ms"]["median"], "{:.0f} ms")
    console.print(
        f"latency: median {latency} over {s['latency_ms']['requests']} requests; median "
        f"{per_pair} per pair (2 requests + measuring); skipped: {s['skipped'] or 'none'}"
    )


def run(args: argparse.Namespace) -> int:
    from PIL import Image

    from facefuse.core.errors import InvalidInput
    from facefuse.core.limits import check_params
    from facefuse.quality.fusion_eval import (
        EvalConfig,
        FaceMeter,
        evaluate,
        image_files,
        prepare,
        to_json,
    )

    if args.pairs is not None and args.pairs < 1:
        raise InvalidInput("--pairs", f"must be at least 1, got {args.pairs}")
    if args.sheet_rows < 0:
        raise InvalidInput("--sheet-rows", f"must be >= 0, got {args.sheet_rows}")
    try:
        check_params(
            20 if args.steps is None else args.steps,
            0.5 if args.strength is None else args.strength,
            7.5 if args.guidance is None else args.guidance,
            args.seed,
        )
    except InvalidInput as exc:  # name the option, not the request field
        raise InvalidInput(f"--{exc.field.lower()}", exc.expectation) from None
    image_files(args.sources, "--sources")  # refuse bad folders before starting a server
    image_files(args.targets, "--targets")
    if args.smiling is not None:
        image_files(args.smiling, "--smiling")
    if args.url is None and not args.repository.is_dir():
        raise InvalidInput("--repository", f"must be a model repository folder: {args.repository}")
    params = {
        k: v
        for k, v in {
            "steps": args.steps,
            "strength": args.strength,
            "guidance": args.guidance,
        }.items()
        if v is not None
    }
    params["seed"] = args.seed
    config = EvalConfig(
        sources=args.sources,
        targets=args.targets,
        ids=_ids(args),
        pairs=args.pairs,
        seed=args.seed,
        size=_size(args),
        params=params,
        sheet_rows=args.sheet_rows,
        smiling=args.smiling,
    )
    meter = FaceMeter()
    prepared = prepare(config, meter)  # every refusal before a server starts
    print(
        f"{len(prepared.pairs)} pairs of {len(prepared.sources)} sources x "
        f"{len(prepared.targets)} targets; paste-only crop {config.size} px",
        flush=True,
    )
    started = time.perf_counter()

    def log(line: str) -> None:
        print(line, flush=True)

    served_info: dict = {}  # the first response's INFO: what the server ran (steps, variant)

    def evaluate_with(url: str) -> tuple[dict, object]:
        from facefuse.client import Client

        with Client(url, "grpc", args.timeout) as client:

            def fuse(source: bytes, target: bytes, instruction: str) -> bytes:
                result = client.fuse(source, target, instruction, **params)
                if not served_info:
                    served_info.update(result.info)
                    served_info.pop("stage_ms", None)
                return result.png

            return evaluate(config, fuse, meter, log, prepared)

    from facefuse.serving.server import served_url

    with served_url(args.repository, args.url, args.out / "tritonserver.log") as (url, where):
        report, sheet = evaluate_with(url)
    report["config"]["server"] = where
    report["config"]["repository"] = str(args.repository)
    report["config"]["served_info"] = served_info
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(to_json(report), indent=2) + "\n")
    if sheet is not None:
        Image.fromarray(sheet).save(args.out / "contact_sheet.png")
    _print_summary(to_json(report))
    print(
        f"wrote {args.out / 'report.json'}" + (", contact_sheet.png" if sheet is not None else "")
    )
    if not report["summary"]["evaluated"]:
        print("no pair could be evaluated", file=sys.stderr)
        return 1
    return 0
