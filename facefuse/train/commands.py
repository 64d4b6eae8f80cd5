"""``facefuse train``: train the ``faces`` model and write it as a diffusers folder."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

from facefuse.core.errors import InvalidInput
from facefuse.train.config import PREDICTIONS, TrainConfig

DEFAULT_DATA = Path("../shared/data")
DEFAULT_TAEF2 = Path("../shared/weights/taef2")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train the embedded 'faces' model on aligned face crops (CPU, resumable)",
        description=(
            "Crop every face of --data with the pipeline's own detector and aligner, encode the "
            "crops once with the frozen TAEF2 encoder, train a small SD 1.x UNet and CLIP text "
            "tower (EMA, min-SNR, conditioning dropout), checkpoint every N steps into --run "
            "(rerun the same command to resume) and write the model folder --out."
        ),
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="photo folders")
    parser.add_argument("--taef2", type=Path, default=DEFAULT_TAEF2, help="TAEF2 weights folder")
    parser.add_argument("--run", type=Path, default=Path("runs/faces"), help="checkpoints, logs")
    parser.add_argument("--out", type=Path, default=None, help="model folder to write at the end")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--sample-steps", type=int, default=20, help="denoising steps of the sample grids"
    )
    parser.add_argument(
        "--until",
        type=int,
        default=None,
        help="train only up to this step (a part of the run: the schedule stays --steps'; "
        "rerun without it to go on); --out is then written from the weights at that step",
    )
    for f in fields(TrainConfig):
        if f.type in ("int", "float"):
            kind = int if f.type == "int" else float
            flag = "--" + f.name.replace("_", "-")
            parser.add_argument(flag, type=kind, default=f.default, help=f"(default {f.default})")
        elif f.name == "prediction":
            parser.add_argument(
                "--prediction", choices=PREDICTIONS, default=f.default, help="the UNet's target"
            )
        elif f.type == "str":
            flag = "--" + f.name.replace("_", "-")
            parser.add_argument(flag, default=f.default, help=f"(default {f.default!r})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from facefuse.train.loop import Trainer, prepare_latents

    if args.threads:
        torch.set_num_threads(args.threads)
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    config = TrainConfig(**values)
    if not args.taef2.is_dir():
        raise InvalidInput("--taef2", f"{args.taef2}: expected the TAEF2 weights folder")
    args.run.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        print(line, file=sys.stderr, flush=True)
        with (args.run / "train.log").open("a") as handle:
            handle.write(line + "\n")

    log(f"config {json.dumps(config.as_dict())}")
    arrays = prepare_latents(config, args.data, args.taef2, args.run, log)
    trainer = Trainer(config, args.run, arrays, args.taef2, log)
    trainer.sample_steps = args.sample_steps
    if args.until is not None and not 1 <= args.until <= config.steps:
        raise InvalidInput(
            "--until", f"must be within 1..--steps ({config.steps}), got {args.until}"
        )
    state = trainer.train(progress=not args.no_progress, until=args.until)
    log(f"trained {state.step} steps in {state.seconds / 60:.1f} min")
    if args.out is not None:
        from facefuse.train.card import model_card
        from facefuse.train.data import GREY
        from facefuse.train.folder import write_model_folder

        extra = {
            "config": config.as_dict(),
            "heldout_london_ids": arrays["heldout"].tolist(),
            "photos": int((arrays["datasets"] != GREY).sum()),
            "grey_copies": int((arrays["datasets"] == GREY).sum()),
            "labels_digest": json.loads(str(arrays["config"])).get("labels", "none"),
            "photos_without_face": arrays["skipped"].tolist(),
            "latent_shift": trainer.shift,
            "latent_scale": trainer.scale,
            "train_minutes": round(state.seconds / 60, 1),
            "trained_steps": state.step,
            "init_training": _init_training(config),
            "final_loss": state.losses[-1][1] if state.losses else None,
            "losses": state.losses,
            "command": "facefuse " + " ".join(sys.argv[1:]),
        }
        write_model_folder(trainer, args.out, model_card(extra), extra)
        log(f"wrote {args.out}")
    return 0


def _init_training(config: TrainConfig) -> dict | None:
    """The warm start's own training record (command, steps, minutes), for the lineage."""
    if not config.init_from:
        return None
    path = Path(config.init_from) / "training.json"
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    keep = ("command", "train_minutes", "final_loss", "init_training")
    return {k: saved.get(k) for k in keep} | {"steps": saved.get("config", {}).get("steps")}
