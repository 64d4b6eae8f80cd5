"""``facefuse txt2img-eval``: the served txt2img's faces and prompt-following, prompts x seeds."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def register(subparsers) -> None:
    from facefuse.quality.txt2img_eval import DEFAULT_PROMPTS, DEFAULT_SEEDS

    parser = subparsers.add_parser(
        "txt2img-eval",
        help="draw prompts x seeds through the served txt2img and report faces found (dlib), "
        "greyness, smile vs neutral mouth width and near-copies of training photos",
        description=(
            "Every prompt at every seed (the same seeds across prompts) through the served "
            "txt2img model and its served prompt template. Reports per prompt the share of "
            "samples where dlib's HOG finds a face, the greyness (mean |channel - grey| of 255), "
            "the mouth width of 'smiling' against 'neutral expression' at the same seed, and, "
            "with --training-data, the descriptor distance of each face to its nearest training "
            "photo. Writes report.json and sheet.png (prompts by seeds) to --out. Without --url "
            "a local tritonserver is started on --repository."
        ),
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--url", default=None, help="gRPC host:port of a running server")
    parser.add_argument(
        "--prompts",
        default="|".join(DEFAULT_PROMPTS),
        help="prompts separated by '|' (default: the six of issue 31)",
    )
    parser.add_argument(
        "--seeds",
        default=",".join(str(s) for s in DEFAULT_SEEDS),
        help="comma-separated request seeds (default 1..8)",
    )
    parser.add_argument(
        "--training-data",
        type=Path,
        default=None,
        help="the training data folder (../shared/data): report near-copies of training faces; "
        "the held-out London people of --model-folder's training.json are left out",
    )
    parser.add_argument(
        "--model-folder",
        type=Path,
        default=Path("facefuse/models/faces"),
        help="model folder whose training.json names the held-out people",
    )
    parser.add_argument("--steps", type=int, default=None, help="1..100 (server default)")
    parser.add_argument("--guidance", type=float, default=None, help="1..30 (server default)")
    parser.add_argument("--out", type=Path, default=Path("reports/txt2img-eval"))
    parser.add_argument("--timeout", type=float, default=600.0, help="request timeout, seconds")
    parser.set_defaults(func=run)


def _seeds(text: str) -> list[int]:
    from facefuse.core.errors import InvalidInput

    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise InvalidInput("--seeds", f"expected comma-separated integers, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds):
        raise InvalidInput("--seeds", f"expected at least one seed >= 0, got {text!r}")
    return seeds


def _bank(args, meter, log):
    """Descriptors of the training photos, cached in --out (keyed by the photo list)."""
    import numpy as np

    from facefuse.quality.txt2img_eval import training_bank
    from facefuse.train.data import collect_photos

    heldout = json.loads((args.model_folder / "training.json").read_text())["heldout_london_ids"]
    paths = sorted(str(p.path) for p in collect_photos(args.training_data, heldout))
    cache = args.out / "training_descriptors.npz"
    if cache.is_file():
        saved = np.load(cache, allow_pickle=False)
        if saved["paths"].tolist() == paths:
            return saved["bank"]
    bank = training_bank([Path(p) for p in paths], meter, log)
    np.savez(cache, bank=bank, paths=np.asarray(paths))
    return bank


def run(args: argparse.Namespace) -> int:
    import numpy as np
    from PIL import Image

    from facefuse.core.errors import InvalidInput
    from facefuse.core.limits import check_params
    from facefuse.face.imageio import decode_image
    from facefuse.quality.fusion_eval import FaceMeter
    from facefuse.quality.txt2img_eval import evaluate, sheet

    prompts = [p.strip() for p in args.prompts.split("|") if p.strip()]
    if not prompts:
        raise InvalidInput("--prompts", "expected at least one prompt ('|'-separated)")
    seeds = _seeds(args.seeds)
    try:
        check_params(args.steps or 20, 0.5, args.guidance or 7.5, 0)
    except InvalidInput as exc:
        raise InvalidInput(f"--{exc.field.lower()}", exc.expectation) from None
    if args.url is None and not args.repository.is_dir():
        raise InvalidInput("--repository", f"must be a model repository folder: {args.repository}")
    if args.training_data is not None and not args.training_data.is_dir():
        raise InvalidInput("--training-data", f"must be a folder: {args.training_data}")
    args.out.mkdir(parents=True, exist_ok=True)
    meter = FaceMeter()

    def log(line: str) -> None:
        print(line, flush=True)

    bank = _bank(args, meter, log) if args.training_data is not None else None
    params = {k: v for k, v in {"steps": args.steps, "guidance": args.guidance}.items() if v}
    served_info: dict = {}
    started = time.perf_counter()

    def with_client(url: str):
        from facefuse.client import Client

        with Client(url, "grpc", args.timeout) as client:

            def generate(prompt: str, seed: int) -> np.ndarray:
                result = client.txt2img(prompt, seed=seed, **params)
                if not served_info:
                    served_info.update(result.info)
                    served_info.pop("stage_ms", None)
                return decode_image(result.png, "IMAGE")

            return evaluate(generate, prompts, seeds, meter, bank, log)

    from facefuse.serving.server import served_url

    with served_url(args.repository, args.url, args.out / "tritonserver.log") as (url, where):
        report, rows = with_client(url)
    report["config"] = {
        "server": where,
        "repository": str(args.repository),
        "prompts": prompts,
        "seeds": seeds,
        "params": params,
        "served_info": served_info,
        "training_faces": None if bank is None else len(bank),
    }
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    Image.fromarray(sheet(rows, prompts, seeds)).save(args.out / "sheet.png")
    print(json.dumps(report["summary"], indent=2))
    print(f"wrote {args.out / 'report.json'}, sheet.png")
    return 0
