"""The model card (``README.md``) written into a trained model folder."""

from __future__ import annotations

CARD = """# faces: the embedded face model of facefuse

A small latent diffusion model trained from scratch, on CPU, by `facefuse train`, to refine
fused faces at {size} px (latents {latent}x{latent}x32). It is the default that
`make demo` and `facefuse export` use.

| part | what | weights |
| --- | --- | --- |
| `unet/` | diffusers `UNet2DConditionModel`, SD 1.x layout, {channels} | trained |
| `text_encoder/` | `CLIPTextModel`, {text_layers} layers, hidden {text_hidden} | trained jointly |
| `tokenizer/` | the real CLIP BPE vocabulary (vocab.json, merges.txt) | - |
| `vae/` | TAEF2 (MIT), frozen; latent shift {shift:.4f}, scale {scale:.4f} | pretrained |
| `scheduler/` | SD 1.x DDPM schedule (scaled linear, 1000 steps, {prediction}) | - |

The text tower is trained with the UNet, from scratch: a random CLIP tower's features carry no
meaning, and no pretrained one can be downloaded here.

## Training
- Command: `{command}`
- {start}
- Steps {steps}, batch {batch}, AdamW lr {lr} (cosine, warm-up {warmup}), EMA {ema},
  {prediction} target, min-SNR gamma {snr}, conditioning dropout {dropout} (empty or the
  default negative prompt); {focus_share:.0%} of the training timesteps drawn below t =
  {focus_timestep} (img2img at strength s starts at t = 1000 s; the served strengths are
  below 0.7), the rest over the whole schedule.
- Wall time: {minutes} min of training on a 2-core CPU (latent preparation not included);
  final loss {loss}.
- Crops: {photos} photos, each face found by the pipeline's detector and cut with its face
  ellipse and crop box, plus {augmentations} augmented copies (flip, +-8 deg, +-8% scale, +-4%
  shift, +-10% colour); {grey}; latents encoded once with the frozen TAEF2 encoder.
- Captions as served: {template_share:.0%} of them start with the deployment's prompt template
  ("{template}, ..."), the words the text encoder's prefix cache serves; {generic_share:.0%}
  carry a generic portrait word ("portrait photo", "headshot", ...) whatever the set; parts are
  comma-separated like the prompt optimizer's output. Each caption says what is known of its
  photo (``facefuse/train/labels``, digest {labels}): the London folder's expression, the
  person ("young woman", "old man", "man"; labelled by looking at each colour photo) and, for
  the congress and inter-faces photos, "smiling" / "neutral expression" where the FaceMesh
  smile classifier is confident (``python -m facefuse.train.expression_labels``).
- Held out (never read for training): London set people {heldout}.

## Data and licences
- Face Research Lab London Set, DeBruine & Jones (2017), doi 10.6084/m9.figshare.5047666.v5,
  **CC BY 4.0**: neutral / smiling photos of {london} people used as training data. These
  weights are derived from it: credit "DeBruine, L. & Jones, B. (2017). Face Research Lab London
  Set" when you redistribute them.
- Congressional Pictorial Directory portraits (US government works, public domain), captioned
  "black and white photo".
- inter-faces avatar set (cjdowner/interfaces 1.4, CC0), captioned by the person and expression.
- TAEF2 weights: MIT licence (THIRD_PARTY_LICENSES.md).

Not for identifying people; trained on few hundred faces, it draws plausible faces at low
resolution and follows "smiling" / "neutral expression" / "black and white".
"""


def model_card(extra: dict) -> str:
    config = extra["config"]
    heldout = extra["heldout_london_ids"]
    return CARD.format(
        size=config["size"],
        latent=config["size"] // 8,
        channels=tuple(config["unet_channels"]),
        text_layers=config["text_layers"],
        text_hidden=config["text_hidden"],
        shift=extra["latent_shift"],
        scale=extra["latent_scale"],
        command=extra["command"],
        steps=_steps(extra),
        start=_start(extra),
        grey=(
            f"{extra.get('grey_copies', 0)} grey copies of the colour photos, captioned "
            f"black and white, drawn {config.get('grey_share', 0):.0%} of the time"
        ),
        template=config.get("template", ""),
        template_share=config.get("template_share", 0.0),
        generic_share=config.get("generic_share", 0.0),
        labels=extra.get("labels_digest", "none"),
        batch=config["batch"],
        lr=config["lr"],
        warmup=config["warmup"],
        ema=config["ema_decay"],
        snr=config["snr_gamma"],
        prediction=config.get("prediction", "epsilon"),
        focus_share=config.get("focus_share", 0.0),
        focus_timestep=config.get("focus_timestep", 1000),
        dropout=config["cond_dropout"],
        minutes=extra["train_minutes"],
        loss=f"{extra['final_loss']:.4f}" if extra["final_loss"] is not None else "n/a",
        photos=extra["photos"],
        augmentations=config["augmentations"],
        heldout=", ".join(heldout),
        london=82 - len(heldout),
    )


def _steps(extra: dict) -> str:
    """``N`` for a whole run, ``N of M (a part of the run: ...)`` when stopped with --until."""
    total, done = extra["config"]["steps"], extra.get("trained_steps", extra["config"]["steps"])
    if done >= total:
        return str(total)
    return f"{done} of a {total}-step schedule (the run was stopped there with --until)"


def _start(extra: dict) -> str:
    init = extra["config"].get("init_from", "")
    if not init:
        return "Started from seeded random weights."
    return (
        f"Started from the model folder `{init}` (its UNet, text tower and latent shift/scale;"
        " its own training is in its training.json, kept here as `init_training`)."
    )
