"""Write a trained run as a diffusers-style model folder, atomically.

The folder holds ``model_index.json``, ``unet/``, ``text_encoder/``, ``vae/`` (TAEF2 with the
run's latent shift/scale), ``tokenizer/``, ``scheduler/``, ``training.json`` and a model card
``README.md``; weights are fp16 safetensors. It is written under a temporary name beside the
destination and renamed when complete, so an interrupted write never leaves a folder that loads.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from facefuse.models.taef2 import CLASS_NAME, load_taef2
from facefuse.prompt.tokenizer import save_tokenizer_files


def write_model_folder(trainer, out: Path, card: str, extra: dict) -> Path:
    """Write ``trainer``'s EMA weights to ``out`` (replaced if present); returns ``out``."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        _write(trainer, tmp, card, extra)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    if old.exists():
        shutil.rmtree(old)
    return out


def _write(trainer, tmp: Path, card: str, extra: dict) -> None:
    unet, text = trainer.ema_models()
    unet.half().save_pretrained(tmp / "unet", safe_serialization=True)
    text.half().save_pretrained(tmp / "text_encoder", safe_serialization=True)
    vae = load_taef2(trainer.taef2_dir)
    vae.register_to_config(scaling_factor=trainer.scale, shift_factor=trainer.shift)
    vae.half().save_pretrained(tmp / "vae", safe_serialization=True)
    licence = trainer.taef2_dir / "LICENSE"
    if licence.is_file():  # TAEF2's MIT licence travels with its weights
        shutil.copyfile(licence, tmp / "vae" / "LICENSE")
    save_tokenizer_files(tmp / "tokenizer")
    (tmp / "scheduler").mkdir()
    scheduler = trainer.config.scheduler_config()
    (tmp / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler, indent=2))
    index = {
        "_class_name": "StableDiffusionPipeline",
        "_diffusers_version": "0.42.1",
        "text_encoder": ["transformers", "CLIPTextModel"],
        "tokenizer": ["transformers", "CLIPTokenizer"],
        "unet": ["diffusers", "UNet2DConditionModel"],
        "vae": ["facefuse", CLASS_NAME],
        "scheduler": ["diffusers", "DDIMScheduler"],
        "_facefuse": {"shape": "faces", "seed": trainer.config.seed},
    }
    (tmp / "model_index.json").write_text(json.dumps(index, indent=2))
    (tmp / "training.json").write_text(json.dumps(extra, indent=2, sort_keys=True))
    (tmp / "README.md").write_text(card)
