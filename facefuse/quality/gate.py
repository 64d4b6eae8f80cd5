"""The fidelity gate: does a precision variant produce the same images as the fp32 reference?

A fixed set of cases (the bundled sample photos and deterministic variations of them, plus
one txt2img prompt) runs through the reference and the candidate variant of one repository,
in-process over ONNX Runtime sessions (:func:`facefuse.diffusion.stages.local_stages`), with
the same scheduler, the same steps, the same seeds and therefore the same initial noise
(:func:`facefuse.diffusion.loop.initial_noise` is seeded numpy PCG64). Face analysis is pure
numpy/OpenCV/dlib and identical for both, so it runs once per case and is shared.

Per case the gate records PSNR and SSIM of the generated crops (before paste-back, so that the
unchanged background does not inflate the score), and the max abs difference of the text
conditioning, of the encoded init latents and of the final latents. The gate passes when the
lowest PSNR is at least the threshold (32 dB by default, the production bar).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from facefuse.core.contract import TARGET_IMAGE
from facefuse.quality.metrics import max_abs_diff, psnr, ssim

DEFAULT_THRESHOLD_DB = 32.0
DEFAULT_STEPS = 20
INSTRUCTION = "a smiling portrait, natural light, sharp focus"
TXT2IMG_PROMPT = "portrait photo of a woman with curly hair, studio light"


@dataclass(frozen=True)
class GateCase:
    """One fixed input. ``source``/``target`` None = a txt2img case on ``instruction``."""

    name: str
    instruction: str
    seed: int
    source: bytes | None = None
    target: bytes | None = None


def _png(rgb: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format="PNG")
    return buffer.getvalue()


def fixed_cases() -> list[GateCase]:
    """The gate's inputs: sample pair both ways, a mirrored, a tone-graded (gamma 1.3,
    contrast 1.2) and an off-centre cropped target (deterministic variations), and one
    txt2img prompt; each with its own fixed seed."""
    from facefuse.core.samples import sample_pair
    from facefuse.face.imageio import decode_image

    grace, astronaut = sample_pair()
    target = decode_image(astronaut, TARGET_IMAGE.name)  # RGB uint8
    mirrored = _png(np.ascontiguousarray(target[:, ::-1]))
    graded = np.clip(((target / 255.0) ** 1.3 - 0.5) * 1.2 + 0.5, 0.0, 1.0)
    graded_png = _png((graded * 255.0 + 0.5).astype(np.uint8))
    cropped = _png(np.ascontiguousarray(target[24:-8, 16:-16]))
    return [
        GateCase("hopper->astronaut", INSTRUCTION, 0, grace, astronaut),
        GateCase("astronaut->hopper", INSTRUCTION, 1, astronaut, grace),
        GateCase("hopper->astronaut-mirrored", "make the face look older", 2, grace, mirrored),
        GateCase("hopper->astronaut-graded", INSTRUCTION, 3, grace, graded_png),
        GateCase("hopper->astronaut-cropped", INSTRUCTION, 4, grace, cropped),
        GateCase("txt2img", TXT2IMG_PROMPT, 5),
    ]


@dataclass
class CaseResult:
    name: str
    psnr_db: float
    ssim: float
    max_abs_conditioning: float
    max_abs_init_latents: float
    max_abs_latents: float
    steps: int


@dataclass
class GateReport:
    reference: str
    candidate: str
    threshold_db: float
    steps: int
    scheduler: str
    candidate_cfg_truncation: float = 0.0
    candidate_batched_rows: int = 0
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def min_psnr_db(self) -> float:
        return min(c.psnr_db for c in self.cases)

    @property
    def min_ssim(self) -> float:
        return min(c.ssim for c in self.cases)

    @property
    def passed(self) -> bool:
        return bool(self.cases) and self.min_psnr_db >= self.threshold_db

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(min_psnr_db=self.min_psnr_db, min_ssim=self.min_ssim, passed=self.passed)
        return data


class _Recorder:
    """Wraps a :class:`Stages` and keeps what crossed it: conditioning, init and final latents."""

    def __init__(self, stages, analyze_faces: Callable):
        from facefuse.diffusion.pipeline import Stages

        self.seen: dict[str, np.ndarray] = {}

        def keep(name: str, fn: Callable, pick: Callable = lambda out, args: out):
            def wrapped(*args):
                out = fn(*args)
                self.seen[name] = np.array(pick(out, args), copy=True)
                return out

            return wrapped

        self.stages = Stages(
            analyze_faces=analyze_faces,
            optimize_prompt=stages.optimize_prompt,
            encode_text=keep("conditioning", stages.encode_text, lambda out, _: out[0]),
            encode_image=keep("init_latents", stages.encode_image),
            unet=stages.unet,
            decode_latents=keep("latents", stages.decode_latents, lambda _, args: args[0]),
        )


def co_batched(unet: Callable, rows: int, seed: int = 0) -> Callable:
    """``unet`` run with ``rows`` extra rows appended to every call, its own rows returned.

    The extra rows stand in for other requests that the served ``unet`` batches alongside:
    seeded standard-normal latents (a noisy latent's scale) at the call's timestep, with the
    call's own conditioning rows repeated. Rows of an fp32 graph are independent, so the result
    is unchanged; a dynamic INT8 graph quantises activations with one scale per tensor, so its
    rows move with their neighbours, and this prices that in the gate."""
    rng = np.random.default_rng(seed)

    def run(sample: np.ndarray, timestep: np.ndarray, context: np.ndarray) -> np.ndarray:
        n = len(sample)
        pick = np.arange(rows) % n
        extra = rng.standard_normal((rows, *sample.shape[1:])).astype(sample.dtype)
        out = unet(
            np.concatenate([sample, extra]),
            np.concatenate([timestep, timestep[pick]]),
            np.concatenate([context, context[pick]]),
        )
        return out[:n]

    return run


def _memo(fn: Callable) -> Callable:
    cache: dict = {}

    def wrapped(source: bytes, target: bytes, size: int):
        key = (source, target, size)
        if key not in cache:
            cache[key] = fn(source, target, size)
        return cache[key]

    return wrapped


def run_gate(
    repository: str | Path,
    reference: str = "fp32",
    candidate: str = "int8",
    threshold_db: float = DEFAULT_THRESHOLD_DB,
    steps: int = DEFAULT_STEPS,
    scheduler: str = "dpm++",
    cases: Sequence[GateCase] | None = None,
    intra_op_threads: int = 0,
    log: Callable[[str], None] = lambda _: None,
    candidate_cfg_truncation: float = 0.0,
    candidate_batched_rows: int = 0,
    candidate_runtimes: dict[str, tuple[str, str]] | None = None,
    inversion: bool = False,
) -> GateReport:
    """Run ``cases`` (default :func:`fixed_cases`) through both variants and compare.

    ``candidate_cfg_truncation`` runs the candidate with classifier-free guidance truncated
    for that last fraction of steps; the reference always runs full guidance, so the gate
    prices the truncation lever and the precision together. ``candidate_batched_rows`` runs
    every candidate UNet call with that many other rows beside it (:func:`co_batched`), as
    under the served ``unet``'s dynamic batching (up to 8 rows: 6 beside a request's 2).
    ``candidate_runtimes`` runs the named candidate graphs on another runtime, e.g.
    ``{"vae_decoder": ("openvino", "bf16")}`` (``local_stages``); the reference stays on ORT.
    ``inversion``: both sides start fusions from the composite's DDIM inversion (the served
    default; needs ``scheduler="ddim"``), so the candidate's error enters twice per step."""
    from facefuse.diffusion.manifest import MANIFEST_NAME, PipelineManifest
    from facefuse.diffusion.pipeline import Pipeline, params_from
    from facefuse.diffusion.stages import local_stages

    root = Path(repository)
    manifest = PipelineManifest.load(root / "facefusion" / "1" / MANIFEST_NAME)
    ref_stages = local_stages(root, intra_op_threads, variant=reference)
    cand_stages = local_stages(
        root, intra_op_threads, variant=candidate, runtimes=candidate_runtimes
    )
    if candidate_batched_rows:
        cand_stages = replace(
            cand_stages, unet=co_batched(cand_stages.unet, candidate_batched_rows)
        )
    faces = _memo(ref_stages.analyze_faces)
    recorders = (_Recorder(ref_stages, faces), _Recorder(cand_stages, faces))
    pipelines = [
        Pipeline(recorders[0].stages, manifest, scheduler, inversion=inversion),
        Pipeline(
            recorders[1].stages,
            manifest,
            scheduler,
            cfg_truncation=candidate_cfg_truncation,
            inversion=inversion,
        ),
    ]
    report = GateReport(
        reference,
        candidate,
        threshold_db,
        steps,
        scheduler,
        candidate_cfg_truncation,
        candidate_batched_rows,
    )
    for case in cases if cases is not None else fixed_cases():
        params = params_from(steps=steps, seed=case.seed)
        images = []
        for pipeline in pipelines:
            if case.source is None:
                image, _ = pipeline.txt2img(case.instruction, params)
            else:
                image, *_ = pipeline.fuse(case.source, case.target, case.instruction, params)
            images.append(image)
        ref_seen, cand_seen = (r.seen for r in recorders)
        init = (
            max_abs_diff(ref_seen["init_latents"], cand_seen["init_latents"])
            if case.source is not None
            else 0.0
        )
        result = CaseResult(
            name=case.name,
            psnr_db=psnr(images[0], images[1]),
            ssim=ssim(images[0], images[1]),
            max_abs_conditioning=max_abs_diff(ref_seen["conditioning"], cand_seen["conditioning"]),
            max_abs_init_latents=init,
            max_abs_latents=max_abs_diff(ref_seen["latents"], cand_seen["latents"]),
            steps=steps,
        )
        for recorder in recorders:
            recorder.seen.clear()
        report.cases.append(result)
        log(format_case(result))
    return report


def format_case(c: CaseResult) -> str:
    return (
        f"{c.name:<28} PSNR {c.psnr_db:6.2f} dB  SSIM {c.ssim:.4f}  "
        f"max|d| cond {c.max_abs_conditioning:.2e} init {c.max_abs_init_latents:.2e} "
        f"latents {c.max_abs_latents:.2e}"
    )
