"""Judge the pipeline's quality trades on held-out people through the served model.

``python -m facefuse.bench.trades --repository model_repository --ids-file F --out DIR``
runs ``facefuse fusion-eval`` once per trade in :data:`TRADES` on the same pairs and seed,
each on a copy of the repository (files hard-linked, configs edited as Triton
``ModelConfig`` messages by :mod:`facefuse.export.configs`), and writes ``DIR/trades.json``
and ``DIR/trades.md``: one row per trade with the identity, expression and PSNR figures.
Each trade changes one thing against ``base`` (the repository as exported).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from facefuse.core.errors import InvalidInput
from facefuse.runtime.variants import DEEP_CACHE_MODELS


@dataclass(frozen=True)
class Trade:
    name: str
    pipeline: dict = field(default_factory=dict)  # facefusion config.pbtxt parameters
    analyzer: dict = field(default_factory=dict)  # face_analyzer config.pbtxt parameters
    unet: dict = field(default_factory=dict)  # parameters of unet, unet_deep and unet_shallow
    vae: dict = field(default_factory=dict)  # parameters of vae_encoder and vae_decoder
    request: dict = field(default_factory=dict)  # fusion-eval --strength/--steps/--guidance


UPPER_FACE_SOURCE = {"upper_face_strength": "0", "upper_face_pixels": "source"}
# The default of 9d4b1c5 (seeded noise, DPM++, strength 0.5, upper face held down to 0.25): the
# trades on it name it in full, so that they run the same on later defaults.
NOISE = {
    "scheduler": "dpm++",
    "inversion": "false",
    "default_steps": "10",
    "default_strength": "0.5",
}
SPLIT = UPPER_FACE_SOURCE | {"upper_face_split": "0.25"} | NOISE
INVERSION = {"scheduler": "ddim", "inversion": "true"}
INVERTED = SPLIT | INVERSION | {"default_strength": "0.7"}  # inverted, 10 steps at 0.7
SHIPPED = INVERTED | {"default_steps": "6", "default_strength": "0.8"}  # a366f0b's default


TRADES = (
    Trade("base"),
    Trade(
        "fp32 unet",
        {"precision": "fp32"},
        unet={"onnx_file": "model.onnx", "runtime": "onnxruntime"},
    ),
    Trade("unet onnxruntime int8", unet={"runtime": "onnxruntime"}),
    Trade(
        "openvino bf16",
        {"precision": "fp32"},  # the fp32 graph, run by OpenVINO in bfloat16 where the CPU can
        unet={"onnx_file": "model.onnx", "runtime": "openvino", "openvino_precision": "bf16"},
    ),
    Trade("strength 0.3", request={"strength": 0.3}),
    Trade("strength 0.4", request={"strength": 0.4}),
    Trade("strength 0.6", request={"strength": 0.6}),
    Trade("guidance 1", request={"guidance": 1.0}),
    Trade("guidance 3", request={"guidance": 3.0}),
    Trade("guidance 5", request={"guidance": 5.0}),
    Trade("steps 10", request={"steps": 10}),
    Trade("adaptive steps", {"adaptive_steps": "true"}),
    Trade("cfg truncation 0.3", {"cfg_truncation": "0.3"}),
    Trade("upper face 0.5", {"upper_face_strength": "0.5"}),
    Trade("feather 0.3", analyzer={"feather": "0.3"}),
    Trade("unipc", {"scheduler": "unipc"}),
    Trade("deepcache 2", {"deep_cache_interval": "2"}),
    Trade("deepcache 3", {"deep_cache_interval": "3"}),
    # the floor: one step at the lowest noise, i.e. little more than the autoencoder's round trip
    Trade("strength 0.05", request={"strength": 0.05}),
    Trade("strength 0.2", request={"strength": 0.2}),
    Trade("upper face 0", {"upper_face_strength": "0"}),
    Trade("upper face 0 + source pixels", UPPER_FACE_SOURCE),
    Trade(
        "upper face 0 + source pixels + deepcache 2",
        UPPER_FACE_SOURCE | {"deep_cache_interval": "2"},
    ),
    Trade(
        "upper face 0 + source pixels + deepcache 3",
        UPPER_FACE_SOURCE | {"deep_cache_interval": "3"},
    ),
    Trade(
        "upper face 0 + source pixels + guidance 5", UPPER_FACE_SOURCE, request={"guidance": 5.0}
    ),
    Trade("strength 0.3 + upper face 0", {"upper_face_strength": "0"}, request={"strength": 0.3}),
    # on the served default (upper face 0 + source pixels, VAEs on OpenVINO bf16)
    Trade("vae onnxruntime", UPPER_FACE_SOURCE, vae={"runtime": "onnxruntime"}),
    Trade("upper face 0 + source pixels + steps 10", UPPER_FACE_SOURCE, request={"steps": 10}),
    Trade("upper face 0 + source pixels + steps 14", UPPER_FACE_SOURCE, request={"steps": 14}),
    Trade(
        "upper face 0 + source pixels + cfg truncation 0.3",
        UPPER_FACE_SOURCE | {"cfg_truncation": "0.3"},
    ),
    # on the served default with default_steps 10
    Trade("autoencoder residual", UPPER_FACE_SOURCE | {"autoencoder_residual": "true"}),
    Trade(
        "autoencoder residual + steps 20",
        UPPER_FACE_SOURCE | {"autoencoder_residual": "true"},
        request={"steps": 20},
    ),
    # the upper face's lower edge moved toward the chin: more of A's composite kept as is
    Trade("upper face split 0.1", UPPER_FACE_SOURCE | {"upper_face_split": "0.1"}),
    Trade("upper face split 0.15", UPPER_FACE_SOURCE | {"upper_face_split": "0.15"}),
    Trade("upper face split 0.2", UPPER_FACE_SOURCE | {"upper_face_split": "0.2"}),
    Trade("upper face split 0.25", UPPER_FACE_SOURCE | {"upper_face_split": "0.25"}),
    Trade("upper face split 0.3", UPPER_FACE_SOURCE | {"upper_face_split": "0.3"}),
    Trade("upper face split 0.45", UPPER_FACE_SOURCE | {"upper_face_split": "0.45"}),
    Trade(
        "upper face split 0.3 + strength 0.6",
        UPPER_FACE_SOURCE | {"upper_face_split": "0.3"},
        request={"strength": 0.6},
    ),
    # on the default of 9d4b1c5 (SPLIT): what is left of the distance to A
    Trade("split 0.25 + strength 0.05", SPLIT, request={"strength": 0.05}),
    Trade("split 0.25 + strength 0.4", SPLIT, request={"strength": 0.4}),
    Trade("split 0.25 + steps 20", SPLIT, request={"steps": 20}),
    Trade("split 0.25 + guidance 10", SPLIT, request={"guidance": 10.0}),
    Trade("split 0.25 + autoencoder residual", SPLIT | {"autoencoder_residual": "true"}),
    # a lower split (more of A's mouth kept) with a stronger pull toward the instruction
    *(
        Trade(
            f"split {split} + guidance {guidance:g}",
            SPLIT | {"upper_face_split": str(split)},
            request={"guidance": guidance},
        )
        for split, guidance in (
            (0.25, 15.0),
            (0.35, 10.0),
            (0.35, 15.0),
            (0.45, 10.0),
            (0.45, 15.0),
        )
    ),
    # DDIM inversion (DiffEdit): start from the composite's own noise, not seeded noise
    Trade("split 0.25 + ddim", SPLIT | {"scheduler": "ddim"}),
    Trade("split 0.25 + ddim inversion", SPLIT | INVERSION),
    Trade("split 0.25 + ddim inversion + steps 20", SPLIT | INVERSION, request={"steps": 20}),
    Trade(
        "split 0.25 + ddim inversion + strength 0.7", SPLIT | INVERSION, request={"strength": 0.7}
    ),
    Trade("split 0 + ddim inversion", SPLIT | INVERSION | {"upper_face_split": "0"}),
    Trade(
        "split 0.25 + ddim inversion + strength 0.6", SPLIT | INVERSION, request={"strength": 0.6}
    ),
    Trade(
        "split 0.25 + ddim inversion + strength 0.8", SPLIT | INVERSION, request={"strength": 0.8}
    ),
    Trade(
        "split 0 + ddim inversion + strength 0.7",
        SPLIT | INVERSION | {"upper_face_split": "0"},
        request={"strength": 0.7},
    ),
    Trade(
        "split 0.25 + ddim inversion + strength 0.7 + guidance 10",
        SPLIT | INVERSION,
        request={"strength": 0.7, "guidance": 10.0},
    ),
    # inverted, 10 steps at 0.7 (INVERTED), and one change at a time
    Trade("inverted 10 steps at 0.7", INVERTED),
    Trade("previous default (dpm++ from noise at 0.5)", SPLIT),
    *(
        Trade(f"inverted + strength {v}", INVERTED, request={"strength": v})
        for v in (0.5, 0.6, 0.8)
    ),
    Trade("inverted + split 0", INVERTED | {"upper_face_split": "0"}),
    Trade("inverted + whole face", INVERTED | {"upper_face_strength": "1"}),
    Trade("inverted + guidance 10", INVERTED, request={"guidance": 10.0}),
    Trade("inverted + steps 20", INVERTED, request={"steps": 20}),
    Trade(
        "inverted + fp32 unet",
        INVERTED | {"precision": "fp32"},
        unet={"onnx_file": "model.onnx", "runtime": "onnxruntime"},
    ),
    Trade("inverted + deepcache 2", INVERTED | {"deep_cache_interval": "2"}),
    # fewer UNet calls: start near the same noise level (t ~ 600) in fewer, longer steps; the
    # shipped default is "inverted + steps 6 strength 0.8"
    *(
        Trade(f"inverted + steps {n} strength {v}", INVERTED, request={"steps": n, "strength": v})
        for n, v in ((5, 0.8), (6, 0.8), (7, 0.7))
    ),
    Trade(
        "inverted + steps 5 strength 0.8 + cfg truncation 0.25",
        INVERTED | {"cfg_truncation": "0.25"},
        request={"steps": 5, "strength": 0.8},
    ),
    # the shipped default (SHIPPED) and the remaining levers on it
    Trade("inverted 6 steps at 0.8", SHIPPED),
    Trade("inverted 6 at 0.8 + adaptive steps", SHIPPED | {"adaptive_steps": "true"}),
    Trade("inverted 6 at 0.8 + feather 0.3", SHIPPED, analyzer={"feather": "0.3"}),
    Trade("inverted 6 at 0.8 + cfg truncation 0.2", SHIPPED | {"cfg_truncation": "0.2"}),
)
# what the server says it ran (INFO of the first response)
SERVED_KEYS = ("variant", "scheduler", "steps_run", "unet_calls", "shallow_calls", "guidance")
SERVED_KEYS += ("strength", "cfg_truncation", "upper_face_strength", "upper_face_pixels")
SERVED_KEYS += ("deep_cache_interval", "autoencoder_residual", "upper_face_split")
SERVED_KEYS += ("inversion",)
FORMATS = {"face found": ".0%", "nearer A": ".0%", "smile wider": ".0%", "median d(A)": ".3f"}
FORMATS |= {"smile/neutral": ".3f", "PSNR out min": ".1f"}
COLUMNS = ("face found", "nearer A", "median d(A)", "smile wider", "smile/neutral", "PSNR out min")


def variant_repository(source: Path, dest: Path, trade: Trade) -> Path:
    """``source`` copied to ``dest`` with ``trade``'s config edits (weights hard-linked)."""
    from facefuse.export import configs

    if dest.exists():
        shutil.rmtree(dest)

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, dest, copy_function=link)
    edits = {"facefusion": trade.pipeline, "face_analyzer": trade.analyzer}
    edits |= {model: trade.unet for model in ("unet", *DEEP_CACHE_MODELS)}
    edits |= {model: trade.vae for model in ("vae_encoder", "vae_decoder")}
    for model, params in edits.items():
        if not params:
            continue
        path = dest / model / "config.pbtxt"
        path.unlink()  # a hard link: edit a fresh file, never the source repository's
        config = configs.read(source / model / "config.pbtxt")
        for key, value in params.items():
            configs.set_parameter(config, key, value)
        configs.write(config, path, generated_by=f"facefuse.bench.trades ({trade.name})")
    return dest


def row(trade: Trade, report: dict) -> dict:
    s = report["summary"]
    neutral, smile, effect = s["neutral"], s["smile"], s["instruction_effect"]
    info = report["config"].get("served_info", {})
    return {
        "trade": trade.name,
        "face found": min(neutral["face_found_share"], smile["face_found_share"]),
        "nearer A": min(neutral["nearer_a_share"], smile["nearer_a_share"]),
        "median d(A)": max(neutral["median_distance_a"], smile["median_distance_a"]),
        "smile wider": effect["smile_wider_share"],
        "smile/neutral": effect["median_smile_over_neutral"],
        "PSNR out min": min(neutral["psnr_outside_min_db"], smile["psnr_outside_min_db"]),
        "latency ms": s["latency_ms"]["median"],
        "paste-only d(A)": s["paste_only"]["median_distance_a"],
        "served": {k: info.get(k) for k in SERVED_KEYS},
    }


def markdown(rows: list[dict]) -> str:
    head = ("trade", *COLUMNS, "latency ms")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        cells = [r["trade"]]
        for key in head[1:]:
            cells.append(format(r[key], FORMATS.get(key, ".0f")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m facefuse.bench.trades", description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--sources", type=Path, default=Path("../shared/data/faces-london/neutral"))
    parser.add_argument("--smiling", type=Path, default=None)
    parser.add_argument("--ids-file", type=Path, required=True, help="held-out IDs, one a line")
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="comma-separated trade names")
    parser.add_argument("--out", type=Path, default=Path("reports/trades"))
    args = parser.parse_args(argv)
    names = {t.name for t in TRADES}
    chosen = TRADES if args.only is None else [t for t in TRADES if t.name in args.only.split(",")]
    if args.only is not None and len(chosen) != len(args.only.split(",")):
        raise InvalidInput("--only", f"names among {sorted(names)}")
    if not (args.repository / "facefusion" / "config.pbtxt").is_file():
        raise InvalidInput("--repository", f"{args.repository}: no facefusion model in it")
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "trades.json"
    rows = json.loads(results_path.read_text()) if results_path.is_file() else []
    done = {r["trade"] for r in rows}
    for trade in chosen:
        if trade.name in done:
            continue
        folder = args.out / trade.name.replace(" ", "-")
        repository = variant_repository(args.repository, args.out / ".repository", trade)
        command = [
            sys.executable, "-m", "facefuse.cli", "fusion-eval",
            "--sources", str(args.sources), "--targets", str(args.sources),
            "--ids-file", str(args.ids_file), "--pairs", str(args.pairs),
            "--seed", str(args.seed), "--repository", str(repository), "--out", str(folder),
        ]  # fmt: skip
        for key, value in trade.request.items():
            command += [f"--{key}", str(value)]
        if args.smiling is not None and not rows:
            command += ["--smiling", str(args.smiling)]
        started = time.perf_counter()
        subprocess.run(command, check=True)
        report = json.loads((folder / "report.json").read_text())
        rows.append({**row(trade, report), "seconds": round(time.perf_counter() - started)})
        results_path.write_text(json.dumps(rows, indent=2))
        print(f"{trade.name}: {rows[-1]}", flush=True)
    shutil.rmtree(args.out / ".repository", ignore_errors=True)
    (args.out / "trades.md").write_text(markdown(rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
