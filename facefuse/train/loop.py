"""Train the embedded ``faces`` model: a small SD 1.x UNet and CLIP text tower on TAEF2 latents.

Run layout (``RUN``): ``latents.npz`` (the frozen TAEF2 encoder's latents of every augmented
crop, made once), ``checkpoint.pt`` (written to a temporary name and renamed, every
``checkpoint_every`` steps; a run resumes from it), ``log.csv``, ``loss.png`` and
``samples/step-NNNNNN.png`` (fixed-seed txt2img grid of the EMA weights per checkpoint).

Invariants: the same config and seed give the same crops, latents, batches and noise (CPU,
fp32); a checkpoint of another config is refused, naming the fields that differ; the text
encoder sees exactly the token ids the served ``prompt_optimizer`` produces
(:func:`facefuse.prompt.optimizer.encode_chunks`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from facefuse.core.errors import InvalidInput, ModelLoadError
from facefuse.prompt.optimizer import DEFAULT_NEGATIVE, encode_chunks
from facefuse.prompt.tokenizer import embedded_tokenizer
from facefuse.train import data
from facefuse.train.config import TrainConfig

CHECKPOINT = "checkpoint.pt"
LATENTS = "latents.npz"
KINDS = tuple(data.CAPTIONS)
# fixed sample prompts of the per-checkpoint grid (one row each)
SAMPLE_PROMPTS = ("smiling", "keep neutral expression", "black and white photo", "portrait photo")


# ----------------------------------------------------------------------------- models
def model_shape(config: TrainConfig):
    """The run's sizes as a :class:`~facefuse.models.tiny.ModelShape` (TAEF2's 32 channels)."""
    from facefuse.models.taef2 import LATENT_CHANNELS
    from facefuse.models.tiny import ModelShape

    return ModelShape(
        text_hidden=config.text_hidden,
        text_layers=config.text_layers,
        text_heads=config.text_heads,
        text_ffn=4 * config.text_hidden,
        unet_channels=config.unet_channels,
        unet_layers_per_block=config.layers_per_block,
        unet_head_dim=config.attention_heads,
        vae_channels=(),  # the VAE is TAEF2, not built from the shape
        vae_layers_per_block=0,
        sample_size=config.latent_size,
        latent_channels=LATENT_CHANNELS,
    )


def build_text_encoder(config: TrainConfig):
    from facefuse.models import tiny

    return tiny.build_text_encoder(model_shape(config), config.seed)


def build_unet(config: TrainConfig):
    from facefuse.models import tiny

    return tiny.build_unet(model_shape(config), config.seed)


def noise_scheduler(config: TrainConfig):
    from diffusers import DDPMScheduler

    keys = ("beta_start", "beta_end", "beta_schedule", "num_train_timesteps", "prediction_type")
    scheduler = config.scheduler_config()
    return DDPMScheduler(**{k: scheduler[k] for k in keys})


# ----------------------------------------------------------------------------- latents
def prepare_latents(config: TrainConfig, data_root: Path, taef2_dir: Path, run: Path, log=print):
    """Crop, augment and encode every training photo once; cached in ``run/latents.npz``."""
    from facefuse.models.taef2 import load_taef2

    path = run / LATENTS
    if path.is_file():
        cached = np.load(path, allow_pickle=False)
        if json.loads(str(cached["config"])) == _latent_key(config):
            return {k: cached[k] for k in cached.files}
        log(f"{path}: made under another crop configuration, rebuilding")
    people = data.london_people(data_root)
    train_people, heldout = data.split_people(people, config.heldout, config.seed)
    photos = data.collect_photos(data_root, heldout)
    vae = load_taef2(taef2_dir)
    rng = np.random.default_rng(config.seed)
    latents, kinds, datasets, labels, skipped = [], [], [], [], []
    started = time.perf_counter()

    def add(crops: list[np.ndarray], kind: str, dataset: str, photo_labels: str) -> None:
        batch = torch.from_numpy(np.stack(crops)).permute(0, 3, 1, 2)
        with torch.no_grad():
            latents.append(vae.raw_encode(batch).numpy().astype(np.float16))
        kinds.append(KINDS.index(kind))
        datasets.append(dataset)
        labels.append(photo_labels)

    for index, photo in enumerate(photos):
        item = data.locate(photo, config.size)
        if item is None:
            skipped.append(str(photo.path))
            continue
        crops = [data.crop(item, config.size)]
        crops += [data.crop(item, config.size, rng) for _ in range(config.augmentations)]
        add(crops, photo.kind, photo.dataset, photo.labels)
        if config.grey_share > 0 and photo.kind != "bw":
            # a grey copy keeps what is known of the photo (its expression, the person)
            add([data.grey(c) for c in crops], "bw", data.GREY, photo.labels)
        if index % 50 == 0:
            log(f"encoded {index + 1}/{len(photos)} photos ({time.perf_counter() - started:.0f} s)")
    if not latents:
        raise InvalidInput("--data", f"{data_root}: no usable face in any photo")
    stacked = np.stack(latents)  # [photos, 1 + augmentations, C, h, w]
    raw = stacked.astype(np.float32)
    arrays = {
        "latents": stacked,
        "kinds": np.asarray(kinds, np.int64),
        "datasets": np.asarray(datasets),
        "labels": np.asarray(labels),
        "shift": np.float32(raw.mean()),
        "scale": np.float32(1.0 / raw.std()),
        "heldout": np.asarray(heldout),
        "train_people": np.asarray(train_people),
        "skipped": np.asarray(skipped),
        "config": np.asarray(json.dumps(_latent_key(config))),
    }
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    log(f"{len(latents)} photos encoded, {len(skipped)} without a face found, -> {path}")
    return arrays


def _latent_key(config: TrainConfig) -> dict:
    """What the cached latents depend on: crop settings and the label files' contents."""
    digest = hashlib.sha256()
    for name in ("people.csv", "expressions.csv"):
        path = data.LABELS / name
        digest.update(path.read_bytes() if path.is_file() else b"")
    return {"size": config.size, "seed": config.seed, "heldout": config.heldout,
            "augmentations": config.augmentations, "grey_copies": config.grey_share > 0,
            "labels": digest.hexdigest()[:16]}  # fmt: skip


# ----------------------------------------------------------------------------- training
@dataclass
class RunState:
    step: int = 0
    losses: list = field(default_factory=list)  # (step, mean loss over the last interval)
    seconds: float = 0.0  # training wall time so far (all sessions)


class Trainer:
    """One run: models, optimiser, EMA, data sampling; :meth:`train` resumes and checkpoints."""

    def __init__(self, config: TrainConfig, run: Path, arrays: dict, taef2_dir: Path, log=print):
        from diffusers.optimization import get_cosine_schedule_with_warmup
        from diffusers.training_utils import EMAModel

        self.config, self.run, self.log = config, Path(run), log
        self.taef2_dir = Path(taef2_dir)
        self._vae = None
        self.sample_steps = 20  # denoising steps of the per-checkpoint sample grid
        self.tokenizer = embedded_tokenizer()
        self.unet = build_unet(config).train()
        self.text_encoder = build_text_encoder(config).train()
        self.shift, self.scale = float(arrays["shift"]), float(arrays["scale"])
        if config.init_from:  # before the optimiser and EMA copy the parameters
            self.shift, self.scale = warm_start(config, self.unet, self.text_encoder)
        params = list(self.unet.parameters()) + list(self.text_encoder.parameters())
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=1e-2)
        self.lr_schedule = get_cosine_schedule_with_warmup(
            self.optimizer, config.warmup, config.steps
        )
        self.ema_unet = EMAModel(self.unet.parameters(), decay=config.ema_decay)
        self.ema_text = EMAModel(self.text_encoder.parameters(), decay=config.ema_decay)
        self.noise = noise_scheduler(config)
        self.latents = torch.from_numpy(arrays["latents"].astype(np.float32))
        self.kinds = arrays["kinds"]
        self.labels = arrays["labels"] if "labels" in arrays else np.full(len(self.kinds), "||")
        # the caption labels' digest (labels/*.csv): a checkpoint resumes only under the same
        self.labels_digest = json.loads(str(arrays.get("config", "{}"))).get("labels", "")
        weights = np.array([data.SAMPLING_WEIGHT[d] for d in arrays["datasets"]], np.float64)
        for dataset in set(arrays["datasets"].tolist()):
            members = arrays["datasets"] == dataset
            weights[members] /= members.sum()
        self.weights = weights / weights.sum()
        self.state = RunState()
        self.generator = torch.Generator().manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)
        self._ids: dict[str, list[int]] = {}

    # -- checkpoints
    def save(self) -> Path:
        path = self.run / CHECKPOINT
        tmp = path.with_suffix(".tmp")
        torch.save(
            {
                "config": self.config.as_dict(),
                "labels_digest": self.labels_digest,
                "state": asdict(self.state),
                "unet": self.unet.state_dict(),
                "text_encoder": self.text_encoder.state_dict(),
                "ema_unet": self.ema_unet.state_dict(),
                "ema_text": self.ema_text.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "lr_schedule": self.lr_schedule.state_dict(),
                "generator": self.generator.get_state(),
                "rng": self.rng.bit_generator.state,
            },
            tmp,
        )
        os.replace(tmp, path)
        return path

    def resume(self) -> bool:
        path = self.run / CHECKPOINT
        if not path.is_file():
            return False
        saved = torch.load(path, map_location="cpu", weights_only=True)
        check_checkpoint_config(path, saved.get("config", {}), self.config.as_dict())
        if saved.get("labels_digest", self.labels_digest) != self.labels_digest:
            raise ModelLoadError(
                f"{path}: checkpoint trained under other caption labels (digest "
                f"{saved['labels_digest']} vs {self.labels_digest} of {data.LABELS}/*.csv); "
                "use another --run folder or the labels it was trained with"
            )
        self.unet.load_state_dict(saved["unet"])
        self.text_encoder.load_state_dict(saved["text_encoder"])
        self.ema_unet.load_state_dict(saved["ema_unet"])
        self.ema_text.load_state_dict(saved["ema_text"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.lr_schedule.load_state_dict(saved["lr_schedule"])
        self.generator.set_state(saved["generator"])
        self.rng.bit_generator.state = saved["rng"]
        self.state = RunState(**saved["state"])
        return True

    # -- one step
    def _token_ids(self, texts: list[str]) -> torch.Tensor:
        rows = []
        for text in texts:
            if text not in self._ids:
                self._ids[text] = encode_chunks(self.tokenizer, text, "truncate", [])[0]
            rows.append(self._ids[text])
        return torch.tensor(rows, dtype=torch.long)

    def _batch(self) -> tuple[torch.Tensor, list[str]]:
        config = self.config
        photos = self.rng.choice(len(self.weights), size=config.batch, p=self.weights)
        versions = self.rng.integers(0, self.latents.shape[1], size=config.batch)
        latents = (self.latents[photos, versions] - self.shift) * self.scale
        texts = []
        for photo in photos:
            if self.rng.random() < config.cond_dropout:
                texts.append("" if self.rng.random() < 0.5 else DEFAULT_NEGATIVE)
                continue
            text = data.caption(
                KINDS[self.kinds[photo]],
                self.rng,
                generic_p=config.generic_share,
                labels=str(self.labels[photo]),
            )
            if config.template and self.rng.random() < config.template_share:
                text = served_prompt(config.template, text)
            texts.append(text)
        return latents, texts

    def _timesteps(self, n: int) -> torch.Tensor:
        """``focus_share`` of the timesteps below ``focus_timestep``, the rest anywhere."""
        steps = self.noise.config.num_train_timesteps
        everywhere = torch.randint(0, steps, (n,), generator=self.generator)
        focused = torch.randint(0, self.config.focus_timestep, (n,), generator=self.generator)
        pick = torch.rand(n, generator=self.generator) < self.config.focus_share
        return torch.where(pick, focused, everywhere)

    def step(self) -> float:
        from diffusers.training_utils import compute_snr

        latents, texts = self._batch()
        noise = torch.randn(latents.shape, generator=self.generator)
        t = self._timesteps(len(latents))
        noisy = self.noise.add_noise(latents, noise, t)
        context = self.text_encoder(self._token_ids(texts)).last_hidden_state
        pred = self.unet(noisy, t, context).sample
        if self.config.prediction == "v_prediction":
            target = self.noise.get_velocity(latents, noise, t)
        else:
            target = noise
        loss = torch.nn.functional.mse_loss(pred, target, reduction="none").mean(dim=(1, 2, 3))
        snr = compute_snr(self.noise, t)
        # min-SNR-gamma (Hang et al. 2023): min(snr, gamma) / snr for an epsilon target,
        # min(snr, gamma) / (snr + 1) for a v target
        clamped = torch.clamp(snr, max=self.config.snr_gamma)
        denominator = snr + 1 if self.config.prediction == "v_prediction" else snr
        loss = (loss * clamped / denominator).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(
            list(self.unet.parameters()) + list(self.text_encoder.parameters()), 1.0
        )
        self.optimizer.step()
        self.lr_schedule.step()
        self.ema_unet.step(self.unet.parameters())
        self.ema_text.step(self.text_encoder.parameters())
        return float(loss.detach())

    def train(self, progress: bool = True, until: int | None = None) -> RunState:
        """Resume and train to ``config.steps``, or only to ``until`` (a part of the run: the
        schedule stays the whole run's, and rerunning without ``until`` goes on from there)."""
        from tqdm import tqdm

        config = self.config
        if self.resume():
            self.log(f"resumed from {self.run / CHECKPOINT} at step {self.state.step}")
        end = config.steps if until is None else min(until, config.steps)
        bar = tqdm(
            total=config.steps, initial=self.state.step, disable=not progress, dynamic_ncols=True
        )
        window: list[float] = []
        last = time.perf_counter()
        while self.state.step < end:
            window.append(self.step())
            self.state.step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{np.mean(window[-50:]):.4f}")
            done = self.state.step
            if done % config.checkpoint_every == 0 or done in (config.steps, end):
                now = time.perf_counter()
                self.state.seconds += now - last
                last = now
                self.state.losses.append((done, float(np.mean(window))))
                window = []
                self.save()
                self.write_reports(
                    samples=done % (2 * config.checkpoint_every) == 0 or done == config.steps
                )
                rate = done / max(self.state.seconds, 1e-9)
                self.log(
                    f"step {done}/{config.steps} loss {self.state.losses[-1][1]:.4f} "
                    f"{self.state.seconds / 60:.1f} min, ETA "
                    f"{(config.steps - done) / rate / 60:.1f} min"
                )
        bar.close()
        return self.state

    # -- reports
    def write_reports(self, samples: bool = True) -> None:
        plot_losses(self.state.losses, self.run / "loss.png")
        with (self.run / "log.csv").open("w") as handle:
            handle.write("step,loss\n")
            handle.writelines(f"{s},{v:.6f}\n" for s, v in self.state.losses)
        if samples:
            folder = self.run / "samples"
            folder.mkdir(exist_ok=True)
            grid = self.sample_grid(steps=self.sample_steps)
            _write_png(folder / f"step-{self.state.step:06d}.png", grid)

    def ema_models(self):
        """Copies of the UNet and text encoder holding the EMA weights, eval mode."""
        import copy

        unet, text = copy.deepcopy(self.unet).eval(), copy.deepcopy(self.text_encoder).eval()
        self.ema_unet.copy_to(unet.parameters())
        self.ema_text.copy_to(text.parameters())
        return unet, text

    @torch.no_grad()
    def sample_grid(self, per_prompt: int = 4, steps: int = 20, guidance: float = 3.0):
        """RGB uint8 grid: one row per :data:`SAMPLE_PROMPTS`, fixed seeds, EMA weights."""
        from diffusers import DDIMScheduler

        from facefuse.models.taef2 import load_taef2

        unet, text = self.ema_models()
        if self._vae is None:
            self._vae = load_taef2(self.taef2_dir)
        vae = self._vae
        scheduler = DDIMScheduler.from_config(
            {k: v for k, v in self.config.scheduler_config().items() if not k.startswith("_")}
        )
        scheduler.set_timesteps(steps)
        rows = []
        uncond = text(self._token_ids([DEFAULT_NEGATIVE])).last_hidden_state
        for prompt in SAMPLE_PROMPTS:
            cond = text(self._token_ids([served_prompt(self.config.template, prompt)]))
            cond = cond.last_hidden_state
            context = torch.cat(
                [uncond.expand(per_prompt, -1, -1), cond.expand(per_prompt, -1, -1)]
            )
            generator = torch.Generator().manual_seed(1234)
            shape = (per_prompt, unet.config.in_channels, self.config.latent_size,
                     self.config.latent_size)  # fmt: skip
            x = torch.randn(shape, generator=generator)
            for t in scheduler.timesteps:
                out = unet(torch.cat([x, x]), t, context).sample
                e_u, e_c = out.chunk(2)
                x = scheduler.step(e_u + guidance * (e_c - e_u), t, x).prev_sample
            images = vae.raw_decode(x / self.scale + self.shift)
            rows.append(torch.cat(list(images), dim=2))
        grid = torch.cat(rows, dim=1).permute(1, 2, 0).numpy()
        return (grid * 255).round().astype(np.uint8)


def served_prompt(template: str, prompt: str) -> str:
    """The text the served prompt_optimizer encodes: ``template, prompt`` (or the prompt)."""
    from facefuse.prompt.optimizer import with_template

    return with_template(template, prompt)


def warm_start(config: TrainConfig, unet, text_encoder) -> tuple[float, float]:
    """Load ``config.init_from``'s UNet and text tower into the run's (same shapes, strict) and
    return its latent (shift, scale), so the UNet keeps the latent space it was trained on."""
    from safetensors.torch import load_file

    folder = Path(config.init_from)
    files = {
        unet: folder / "unet" / "diffusion_pytorch_model.safetensors",
        text_encoder: folder / "text_encoder" / "model.safetensors",
    }
    for model, path in files.items():
        if not path.is_file():
            raise InvalidInput("--init-from", f"{path}: missing (expected a faces model folder)")
        weights = {k: v.float() for k, v in load_file(path).items()}
        try:
            model.load_state_dict(weights, strict=True)
        except RuntimeError as exc:
            raise InvalidInput(
                "--init-from", f"{path}: weights of another shape than this run's ({exc})"
            ) from exc
    vae = json.loads((folder / "vae" / "config.json").read_text())
    return float(vae["shift_factor"]), float(vae["scaling_factor"])


def check_checkpoint_config(path: Path, saved: dict, current: dict) -> None:
    """Raise ModelLoadError naming the fields where a checkpoint's config differs."""
    differ = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
    if differ:
        details = ", ".join(f"{k}: {saved.get(k)!r} vs {current.get(k)!r}" for k in differ)
        raise ModelLoadError(
            f"{path}: checkpoint of another configuration ({details}); "
            "use another --run folder or the same options"
        )


def plot_losses(losses: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if losses:
        steps, values = zip(*losses)
        ax.plot(steps, values, marker=".")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (min-SNR weighted, mean per interval)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _write_png(path: Path, rgb: np.ndarray) -> None:
    import cv2

    cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
