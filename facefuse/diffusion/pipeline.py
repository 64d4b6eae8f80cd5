"""The face-fusion and txt2img orchestrators, over pluggable stages.

:class:`Stages` are plain callables on numpy arrays, so the same orchestrator runs in a
Triton BLS model (each stage a call to another model) and in-process (each stage an ORT
session), which is how the server's overhead is measured. Phases, in order: check inputs,
analyse faces, optimise prompt, encode text, encode image, denoise, decode, paste back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from facefuse.core.contract import TARGET_IMAGE
from facefuse.core.limits import DEFAULT_LIMITS, GenerationParams, Limits, check_params
from facefuse.diffusion.loop import (
    DEFAULT_SCHEDULER,
    DeepCacheUnets,
    LoopRequest,
    denoise,
    make_scheduler,
)
from facefuse.diffusion.manifest import PipelineManifest

DEFAULT_STEPS = 20
DEFAULT_STRENGTH = 0.5
DEFAULT_GUIDANCE = 7.5
DEFAULT_SEED = 0
UPPER_FACE_PIXELS = ("decoded", "source")


@dataclass
class Stages:
    """The callables a pipeline runs. Shapes: ids [N,77] int64, images NCHW in [-1, 1]."""

    analyze_faces: Callable[[bytes, bytes, int], tuple[np.ndarray, np.ndarray, np.ndarray]]
    optimize_prompt: Callable[[str], tuple[np.ndarray, np.ndarray, dict]]
    encode_text: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    encode_image: Callable[[np.ndarray], np.ndarray]
    unet: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    decode_latents: Callable[[np.ndarray], np.ndarray]
    deep_cache: DeepCacheUnets | None = None  # the unet_deep / unet_shallow pair, when served
    # analyze_faces with an expression edit (JSON of facefuse.face.expression_edit's
    # ExpressionEdit) -> (composite, mask, crop_box, info dict); when given, fusion moves A's
    # face to B's expression plus the instruction's edits (issue 30)
    # (its fifth argument: REFERENCE_FACE's bytes or None, for the face selection)
    analyze_faces_expression: (
        Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, dict]] | None
    ) = None


@dataclass
class Timer:
    """Per-stage wall milliseconds, in call order."""

    ms: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, fn: Callable, *args):
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.ms[name] = round(self.ms.get(name, 0.0) + 1000 * (time.perf_counter() - start), 2)


def params_from(
    steps=None, strength=None, guidance=None, seed=None, limits: Limits = DEFAULT_LIMITS
) -> GenerationParams:
    """Fill defaults for absent parameters and validate them all."""
    return check_params(
        DEFAULT_STEPS if steps is None else steps,
        DEFAULT_STRENGTH if strength is None else strength,
        DEFAULT_GUIDANCE if guidance is None else guidance,
        DEFAULT_SEED if seed is None else seed,
        limits,
    )


def options_from_parameters(params: dict[str, str]) -> dict:
    """:class:`Pipeline` keyword options from a pipeline model's config parameters (strings),
    absent ones at their defaults; ValueError naming the parameter on a malformed value. The
    served model (``facefuse.serving.triton_pipeline``) and the in-process benches read the
    same ``facefusion/config.pbtxt`` through this."""

    def number(key: str, kind: type, default: str):
        raw = params.get(key, default)
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"pipeline parameter {key} must be a number, got {raw!r}") from None

    residual, inversion = (
        params.get(k, "false").lower() for k in ("autoencoder_residual", "inversion")
    )
    for key, value in (("autoencoder_residual", residual), ("inversion", inversion)):
        if value not in ("true", "false"):
            raise ValueError(f"pipeline parameter {key} must be true or false, got {value!r}")
    options = {
        "scheduler": params.get("scheduler", DEFAULT_SCHEDULER),
        "adaptive_steps": params.get("adaptive_steps", "false").lower() == "true",
        "cfg_truncation": number("cfg_truncation", float, "0"),
        "upper_face_strength": number("upper_face_strength", float, "1"),
        "upper_face_pixels": params.get("upper_face_pixels", "decoded"),
        "upper_face_split": number("upper_face_split", float, "0"),
        "autoencoder_residual": residual == "true",
        "inversion": inversion == "true",
        "deep_cache_interval": number("deep_cache_interval", int, "1"),
        "default_steps": number("default_steps", int, str(DEFAULT_STEPS)),
        "default_strength": number("default_strength", float, str(DEFAULT_STRENGTH)),
    }
    try:
        check_options(options)
    except ValueError as exc:
        raise ValueError(f"pipeline parameter {exc}") from None
    return options


def check_options(options: dict) -> None:
    """ValueError naming the first of :class:`Pipeline`'s options (by keyword) that is out of
    range; the served parameters (:func:`options_from_parameters`, which prefixes "pipeline
    parameter") and direct library callers (:class:`Pipeline`) go through this one check."""
    limits = DEFAULT_LIMITS
    ranges = {  # key: (low, high, how the range is written)
        "cfg_truncation": (0.0, 1.0, "[0, 1]"),
        "upper_face_strength": (0.0, 1.0, "[0, 1]"),
        "upper_face_split": (-1.0, 1.0, "[-1, 1]"),
        "default_steps": (
            limits.min_steps,
            limits.max_steps,
            f"{limits.min_steps}..{limits.max_steps}",
        ),
        "default_strength": (
            limits.min_strength,
            limits.max_strength,
            f"[{limits.min_strength}, {limits.max_strength}]",
        ),
    }
    for key, (low, high, written) in ranges.items():
        if key in options and not low <= options[key] <= high:
            raise ValueError(f"{key} must be in {written}, got {options[key]}")
    if options.get("deep_cache_interval", 1) < 1:
        raise ValueError(f"deep_cache_interval must be >= 1, got {options['deep_cache_interval']}")
    pixels = options.get("upper_face_pixels", UPPER_FACE_PIXELS[0])
    if pixels not in UPPER_FACE_PIXELS:
        raise ValueError(f"upper_face_pixels must be one of {UPPER_FACE_PIXELS}, got {pixels!r}")


def to_nchw(image: np.ndarray) -> np.ndarray:
    """HxWx3 float in [0, 1] -> 1x3xHxW in [-1, 1]."""
    return (image.transpose(2, 0, 1)[None] * 2.0 - 1.0).astype(np.float32)


def from_nchw(image: np.ndarray) -> np.ndarray:
    """1x3xHxW in [-1, 1] -> HxWx3 float in [0, 1], clipped; NaN is refused."""
    if not np.all(np.isfinite(image)):
        raise FloatingPointError("decoded image contains NaN or inf")
    return np.clip(image[0].transpose(1, 2, 0) / 2.0 + 0.5, 0.0, 1.0)


def latent_mask(mask: np.ndarray, latent_size: int) -> np.ndarray:
    """Pixel mask [S,S] -> [1,s,s] by area averaging (S divisible by s)."""
    factor = mask.shape[0] // latent_size
    pooled = mask[: latent_size * factor, : latent_size * factor]
    pooled = pooled.reshape(latent_size, factor, latent_size, factor).mean(axis=(1, 3))
    return pooled[None].astype(np.float32)


def restore_held_pixels(
    composite: np.ndarray, decoded: np.ndarray, mask: np.ndarray, weight: np.ndarray
) -> np.ndarray:
    """``composite * (1 - w) + decoded' * w``: the held-back share ``1 - w`` of the face from
    the composite's pixels, the rest from the decoder, where ``decoded'`` is ``decoded`` shifted
    per channel so that its mean over the regenerated face (``mask * w``) equals the
    composite's there: the model's colour drift (a warm cast at high guidance) would otherwise
    show as a step where the held region meets the regenerated one. HxWx3 in [0, 1] in and out;
    an empty regenerated region gets no shift."""
    region = (mask * weight)[..., None]
    total = float(region.sum())
    shift = 0.0
    if total > 1e-6:
        shift = ((composite - decoded) * region).sum(axis=(0, 1)) / total
    w = weight[..., None]
    return np.clip(composite * (1.0 - w) + (decoded + shift) * w, 0.0, 1.0).astype(np.float32)


def add_roundtrip_residual(
    composite: np.ndarray, decoded: np.ndarray, roundtrip: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """``decoded + mask * (composite - roundtrip)``, clipped to [0, 1]: where diffusion changed
    nothing (``decoded == roundtrip``, the composite's own decode) the composite comes back
    exactly, and elsewhere the autoencoder's detail loss is added back to the change. HxWx3 in
    [0, 1], ``mask`` HxW in [0, 1] (outside it the caller pastes B's pixels anyway)."""
    residual = (composite - roundtrip) * mask[..., None]
    return np.clip(decoded + residual, 0.0, 1.0).astype(np.float32)


def _context(hidden: np.ndarray) -> np.ndarray:
    """[N,77,D] chunk embeddings -> [N*77, D] conditioning (A1111-style concatenation)."""
    return hidden.reshape(-1, hidden.shape[-1])


class Pipeline:
    """Runs face fusion and txt2img over :class:`Stages` for one exported model."""

    def __init__(
        self,
        stages: Stages,
        manifest: PipelineManifest,
        scheduler: str = DEFAULT_SCHEDULER,
        adaptive_steps: bool = False,
        cfg_truncation: float = 0.0,
        variant: str = "fp32",
        upper_face_strength: float = 1.0,
        deep_cache_interval: int = 1,
        upper_face_pixels: str = "decoded",
        default_steps: int = DEFAULT_STEPS,
        autoencoder_residual: bool = False,
        upper_face_split: float = 0.0,
        inversion: bool = False,
        default_strength: float = DEFAULT_STRENGTH,
    ):
        """``default_steps`` / ``default_strength``: the STEPS / STRENGTH of a request that
        names none (the served parameters of those names; the caller fills them in).
        ``adaptive_steps``: fusion requests that give no STEPS (``fuse(..., auto_steps=
        True)``) get 15..30 steps from the face's complexity (:mod:`.adaptive`).
        ``cfg_truncation``: skip the unconditional half for this last fraction of steps.
        ``upper_face_strength``: the share of STRENGTH the eyes and brows get (1: the whole
        face alike); the mouth and chin always get all of it
        (:func:`~facefuse.face.mask.upper_face_weight`).
        ``upper_face_pixels``: "source" takes the held-back share of the upper face from the
        composite's pixels (:func:`restore_held_pixels`: the decode, its mean colour matched to
        the composite's over the regenerated face, weighted by that share map), so what
        diffusion did not regenerate does not pay the autoencoder's round trip either;
        "decoded" keeps the decoder's output everywhere. No effect at upper_face_strength 1.
        ``upper_face_split``: where the upper face ends, in semi-axes of the face ellipse below
        its centre (0: between nose and mouth; larger holds more of the lower face).
        ``autoencoder_residual``: add back what the autoencoder's round trip loses on the
        composite, ``composite - decode(encode(composite))`` (one more decoder call), so the
        output is the composite plus what diffusion changed (:func:`add_roundtrip_residual`).
        ``inversion``: fusion starts from the composite's DDIM inversion instead of seeded noise
        (:func:`~facefuse.diffusion.loop.invert`, DiffEdit); needs ``scheduler="ddim"``.
        ``deep_cache_interval``: N > 1 runs DeepCache (the whole UNet every N steps, its
        shallow layers between; ``stages.deep_cache`` must be given)."""
        check_options(
            {
                "cfg_truncation": cfg_truncation,
                "upper_face_strength": upper_face_strength,
                "upper_face_pixels": upper_face_pixels,
                "upper_face_split": upper_face_split,
                "deep_cache_interval": deep_cache_interval,
                "default_steps": default_steps,
                "default_strength": default_strength,
            }
        )
        if inversion and scheduler != "ddim":
            raise ValueError(f"inversion needs the ddim scheduler, got {scheduler!r}")
        if deep_cache_interval > 1 and stages.deep_cache is None:
            raise ValueError(
                f"deep_cache_interval {deep_cache_interval} needs the unet_deep/unet_shallow models"
            )
        self.deep_cache_interval = deep_cache_interval
        self.default_steps = int(default_steps)
        self.default_strength = float(default_strength)
        self.upper_face_strength = upper_face_strength
        self.upper_face_pixels = upper_face_pixels
        self.upper_face_split = float(upper_face_split)
        self.autoencoder_residual = bool(autoencoder_residual)
        self.inversion = bool(inversion)
        self.stages = stages
        self.manifest = manifest
        self.scheduler_name = scheduler
        self.adaptive_steps = adaptive_steps
        self.cfg_truncation = cfg_truncation
        self.variant = variant  # reported in INFO (A/B routing, FP32 fallback)
        make_scheduler(scheduler, manifest.scheduler_config)  # fail at load on a bad name

    def _encode_prompt(self, timer: Timer, instruction: str, plain_ok: bool = False):
        """(cond, uncond, info); ``plain_ok`` (fusion): an instruction that asks for a plain
        swap (:func:`~facefuse.prompt.plain.is_plain`), or one with nothing the optimiser can
        describe, is served with the plain prompt and INFO says ``"asked": "nothing"``."""
        from facefuse.core.errors import InvalidInput
        from facefuse.prompt.plain import PLAIN_PROMPT, is_plain

        plain, warning = plain_ok and is_plain(instruction), None
        try:
            prompt_ids, negative_ids, prompt_info = timer.run(
                "prompt", self.stages.optimize_prompt, PLAIN_PROMPT if plain else instruction
            )
        except InvalidInput as exc:
            if not plain_ok or "no describable content" not in str(exc):
                raise
            plain, warning = True, f"nothing to describe in {instruction!r}: a plain swap"
            prompt_ids, negative_ids, prompt_info = timer.run(
                "prompt", self.stages.optimize_prompt, PLAIN_PROMPT
            )
        if plain_ok:
            prompt_info = {**prompt_info, "asked": "nothing" if plain else "edit"}
            prompt_info["instruction"] = instruction
            if warning:
                prompt_info["warnings"] = [*prompt_info.get("warnings", []), warning]
        ids = np.concatenate([prompt_ids, negative_ids]).astype(np.int64)
        hidden, hit_tokens = timer.run("text_encoder", self.stages.encode_text, ids)
        n = len(prompt_ids)
        info = dict(prompt_info)
        info["cache_hit_tokens"] = [int(h) for h in np.asarray(hit_tokens).reshape(-1)]
        return _context(hidden[:n]), _context(hidden[n:]), info

    def _denoise(self, timer: Timer, request: LoopRequest):
        scheduler = make_scheduler(self.scheduler_name, self.manifest.scheduler_config)
        return timer.run(
            "denoise", denoise, self.stages.unet, scheduler, request, self.stages.deep_cache
        )

    def _analyze(self, timer: Timer, source, target, instruction, expression, reference=None):
        """(composite, mask, crop_box, face info): with the expression stage, A's face moved to
        the chosen expression plus the instruction's words and the request's numbers."""
        size = self.manifest.image_size
        if self.stages.analyze_faces_expression is None:
            return (*timer.run("face", self.stages.analyze_faces, source, target, size), {})
        from facefuse.face.expression_edit import ExpressionEdit, words_from_instruction

        edit = ExpressionEdit(
            **{**(expression or {}), "words": words_from_instruction(instruction)}
        )
        return timer.run(
            "face",
            self.stages.analyze_faces_expression,
            source,
            target,
            size,
            edit.to_json(),
            reference,
        )

    def fuse(
        self,
        source: bytes,
        target: bytes,
        instruction: str,
        params: GenerationParams,
        auto_steps: bool = False,
        should_stop: Callable[[], bool] | None = None,
        expression: dict | None = None,
        reference: bytes | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
        """Returns (fused crop HxWx3 in [0,1], mask, crop_box, info); the caller pastes back.

        With ``auto_steps`` and adaptive steps on, ``params.steps`` is replaced by the steps
        chosen from the masked composite's complexity (reported in ``info["adaptive"]``).
        ``expression``: the request's expression fields as ExpressionEdit keywords
        (``source``, ``smile``, ``mouth_open``; absent: B's expression); the instruction's words
        are added here. Used only where the stages have ``analyze_faces_expression``;
        ``info["expression"]`` then reports what was applied. ``expression`` may also name
        ``face_select`` and ``face_index`` (which face of B; ``reference``: REFERENCE_FACE's
        bytes), ``info["faces"]`` reports them."""
        timer = Timer()
        composite, mask, crop_box, face_info = self._analyze(
            timer, source, target, instruction, expression, reference
        )
        adaptive = None
        if auto_steps and self.adaptive_steps:
            from dataclasses import replace

            from facefuse.diffusion.adaptive import measure

            adaptive = timer.run("adaptive", measure, composite, mask)
            params = replace(params, steps=adaptive.steps)
        cond, uncond, info = self._encode_prompt(timer, instruction, plain_ok=True)
        fused, result = self.refine(timer, composite, mask, params, (cond, uncond), should_stop)
        info.update(self._loop_info(params, result), stage_ms=timer.ms)
        info.update(face_info)
        info["steps_policy"] = "adaptive" if adaptive is not None else "fixed"
        if adaptive is not None:
            info["adaptive"] = adaptive.info()
        return fused, mask, crop_box, info

    def encode_prompt(self, instruction: str) -> tuple[tuple[np.ndarray, np.ndarray], dict]:
        """((cond, uncond) contexts, prompt info) for an instruction: what a stream computes
        once and hands to every frame's :meth:`refine`."""
        timer = Timer()
        cond, uncond, info = self._encode_prompt(timer, instruction, plain_ok=True)
        info["stage_ms"] = timer.ms
        return (cond, uncond), info

    def refine(
        self,
        timer: Timer,
        composite: np.ndarray,
        mask: np.ndarray,
        params: GenerationParams,
        context: tuple[np.ndarray, np.ndarray],
        should_stop: Callable[[], bool] | None = None,
    ):
        """Latent diffusion on a face stage's composite (HxWx3 in [0, 1]) within ``mask``:
        encode, denoise (inverted or from ``params.seed``'s noise), decode, restore the held
        pixels. Returns (fused crop HxWx3 in [0, 1], the loop's result). The still
        :meth:`fuse` and every stream frame (``facefuse.diffusion.stream``) run this."""
        cond, uncond = context
        init = timer.run("vae_encoder", self.stages.encode_image, to_nchw(composite))
        strength_map = weight = None
        if self.upper_face_strength < 1.0:
            from facefuse.face.mask import upper_face_weight

            weight = upper_face_weight(mask, self.upper_face_strength, split=self.upper_face_split)
            strength_map = latent_mask(weight, self.manifest.latent_size)
        request = LoopRequest(
            cond=cond,
            uncond=uncond,
            steps=params.steps,
            guidance=params.guidance,
            seed=params.seed,
            strength=params.strength,
            init_latents=init[0],
            latent_mask=latent_mask(mask, self.manifest.latent_size),
            strength_map=strength_map,
            cfg_truncation=self.cfg_truncation,
            deep_cache_interval=self.deep_cache_interval,
            invert=self.inversion,
            should_stop=should_stop,
        )
        result = self._denoise(timer, request)
        decoded = timer.run("vae_decoder", self.stages.decode_latents, result.latents[None])
        fused = from_nchw(decoded)
        if self.autoencoder_residual:
            roundtrip = timer.run("vae_decoder_init", self.stages.decode_latents, init)
            fused = add_roundtrip_residual(composite, fused, from_nchw(roundtrip), mask)
        if weight is not None and self.upper_face_pixels == "source":
            fused = restore_held_pixels(composite, fused, mask, weight)
        return fused, result

    def fuse_png(
        self, source: bytes, target: bytes, instruction: str, params: GenerationParams, **kwargs
    ) -> tuple[bytes, dict]:
        """:meth:`fuse`, then B with the result pasted back, as PNG bytes; what ``facefusion``
        answers. ``info["stage_ms"]["paste_png"]`` times the target decode, paste and encode."""
        from facefuse.face.fusion import FusionPlan, paste_back
        from facefuse.face.imageio import decode_image, encode_png

        fused, mask, crop_box, info = self.fuse(source, target, instruction, params, **kwargs)
        started = time.perf_counter()
        target_rgb = decode_image(target, TARGET_IMAGE.name)
        result = paste_back(target_rgb, fused, FusionPlan.from_arrays(fused, mask, crop_box))
        chosen = info.get("faces", {}).get("fused", [])
        if len(chosen) > 1:  # FACE_SELECT "all": each further face gets the same treatment
            expression = dict(kwargs.pop("expression", None) or {})
            info["faces"]["each"] = [info.pop("expression", None)]
            for index in range(1, len(chosen)):
                fused, mask, crop_box, more = self.fuse(
                    source, target, instruction, params,
                    expression={**expression, "face_index": index}, **kwargs,
                )  # fmt: skip
                plan = FusionPlan.from_arrays(fused, mask, crop_box)
                result = paste_back(result, fused, plan)
                info["faces"]["each"].append(more.get("expression"))
                for stage, ms in more["stage_ms"].items():
                    info["stage_ms"][stage] = round(info["stage_ms"].get(stage, 0.0) + ms, 2)
        png = encode_png(result)
        info["stage_ms"]["paste_png"] = round(1000 * (time.perf_counter() - started), 2)
        return png, info

    def txt2img(
        self,
        prompt: str,
        params: GenerationParams,
        should_stop: Callable[[], bool] | None = None,
    ) -> tuple[np.ndarray, dict]:
        """Returns (image HxWx3 in [0,1], info); ``params.strength`` is ignored (always 1).

        ``should_stop`` (both methods): checked before every denoising step, True raises
        :class:`~facefuse.diffusion.loop.DenoiseCancelled` (client cancellation)."""
        timer = Timer()
        cond, uncond, info = self._encode_prompt(timer, prompt)
        s = self.manifest.latent_size
        request = LoopRequest(
            cond=cond,
            uncond=uncond,
            steps=params.steps,
            guidance=params.guidance,
            seed=params.seed,
            latent_shape=(self.manifest.latent_channels, s, s),
            cfg_truncation=self.cfg_truncation,
            deep_cache_interval=self.deep_cache_interval,
            should_stop=should_stop,
        )
        result = self._denoise(timer, request)
        decoded = timer.run("vae_decoder", self.stages.decode_latents, result.latents[None])
        info.update(self._loop_info(params, result), stage_ms=timer.ms)
        return from_nchw(decoded), info

    def _loop_info(self, params: GenerationParams, result) -> dict:
        return {
            "scheduler": self.scheduler_name,
            "steps": params.steps,
            "steps_run": result.steps_run,
            "strength": params.strength,
            "guidance": params.guidance,
            "seed": params.seed,
            "unet_calls": result.unet_calls,
            "deep_cache_interval": self.deep_cache_interval,
            "shallow_calls": result.shallow_calls,
            "cfg_truncation": self.cfg_truncation,
            "upper_face_strength": self.upper_face_strength,
            "upper_face_pixels": self.upper_face_pixels,
            "upper_face_split": self.upper_face_split,
            "autoencoder_residual": self.autoencoder_residual,
            "inversion": self.inversion,
            "variant": self.variant,
            "model_id": self.manifest.model_id,
        }


def info_json(info: dict) -> str:
    return json.dumps(info, sort_keys=True)
