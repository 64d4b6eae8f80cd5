"""``facefuse bench gpu``: the UNet per denoising step in FP32 and FP16 on a GPU, side by side.

Issue 5's GPU measurement, prepared as one short command for a host with a GPU: the
SD-1.5-shaped UNet (random weights, 860M parameters) at a 64x64 latent, batch 2 (one
classifier-free-guidance step), PyTorch eager in FP32 and in FP16 (``.half()`` weights and
inputs), calls interleaved and timed between ``torch.cuda.synchronize`` calls. It reports the
median ms per step and the speed-up, the max abs difference of FP16 to FP32, the peak memory of
each precision, the GPU and its free memory (``facefuse.runtime.memory.gpu_free``, NVML
first) with the FP32-fallback decision that ``facefusion`` would take at load with
``fallback_margin_mb`` = ``--margin-mib`` (``decide_gpu_variant``), and
whether TensorRT is importable (the engine is timed by ``trtexec`` on the exported plan where it
is; this command says so instead of guessing a figure).

``--device cpu --shape tiny`` runs the same code without a GPU (tests use it). Needs torch and
diffusers only.
"""

from __future__ import annotations

import copy
import time

import numpy as np

from facefuse.bench import print_report, progress_log

PRECISIONS = {"fp32": "float32", "fp16": "float16"}
# facefusion's `fallback_margin_mb` is 0 (off) in its configs; the bench shows the decision at this
DEFAULT_MARGIN_MIB = 2048


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "gpu",
        help="UNet per step, PyTorch FP32 vs FP16 on a GPU (SD-1.5 shape, 64x64 latent)",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--device", default="cuda", help="torch device (cpu for a dry run)")
    parser.add_argument("--shape", default="sd15", choices=("sd15", "mid", "tiny"))
    parser.add_argument("--latent", type=int, default=64, help="latent side (64 = 512x512)")
    parser.add_argument("--batch", type=int, default=2, help="UNet batch (2 = one CFG step)")
    parser.add_argument("--iters", type=int, default=20, help="timed steps per precision")
    parser.add_argument(
        "--margin-mib",
        type=int,
        default=DEFAULT_MARGIN_MIB,
        help="show the FP32-fallback decision for this fallback_margin_mb",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    # issue 21: UNet rows/s per batch size, eager vs CUDA graphs, and img2img end to end
    from facefuse.gpu.bench import add_arguments

    add_arguments(parser)
    parser.set_defaults(func=run)


def _check(args) -> None:
    from facefuse.core.errors import InvalidInput

    if args.iters < 1 or args.batch < 1:
        raise InvalidInput("--iters/--batch", "must be >= 1")
    if args.latent < 8 or args.latent % 8:
        raise InvalidInput("--latent", f"must be a multiple of 8, got {args.latent}")
    from facefuse.gpu.bench import check_arguments

    check_arguments(args)


def _device(name: str):
    import torch

    from facefuse.core.errors import InvalidInput

    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise InvalidInput(
            "--device", f"must be a torch device such as cuda or cpu ({exc})"
        ) from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInput("--device", "cuda was asked for but torch sees no CUDA device")
    return device


def _tensorrt() -> str:
    try:
        import tensorrt
    except ImportError:
        return "not installed: the TensorRT engine is not measured here"
    return f"tensorrt {tensorrt.__version__} importable: time the plan with trtexec"


def bench(args, log) -> dict:
    import torch

    from facefuse.models.tiny import NAMED_SHAPES, SD15, build_unet
    from facefuse.runtime.memory import MIB, decide_gpu_variant, gpu_free

    device = _device(args.device)
    cuda = device.type == "cuda"
    shape = SD15 if args.shape == "sd15" else NAMED_SHAPES[args.shape]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rng = np.random.default_rng(args.seed)
    inputs = (
        rng.standard_normal((args.batch, 4, args.latent, args.latent)),
        np.full(args.batch, 500.0),
        rng.standard_normal((args.batch, 77, shape.text_hidden)),
    )
    with torch.device(device):  # weights initialised on the device (seconds, not a minute)
        fp32 = build_unet(shape, args.seed)
    models = {"fp32": fp32, "fp16": copy.deepcopy(fp32).half()}  # the same weights, halved
    feeds = {
        name: [torch.from_numpy(a).to(device, getattr(torch, PRECISIONS[name])) for a in inputs]
        for name in models
    }

    def step(name: str):
        with torch.inference_mode():
            out = models[name](*feeds[name], return_dict=False)[0]
        sync()
        return out

    outputs, peak = {}, {}
    for name in models:  # warm-up (cuDNN autotuning, allocations) and peak memory per precision
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        outputs[name] = step(name).float()
        peak[name] = torch.cuda.max_memory_allocated(device) / MIB if cuda else None
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.iters):
        for name in models:
            t0 = time.perf_counter()
            step(name)
            times[name].append(time.perf_counter() - t0)
    median = {name: float(np.median(t) * 1000.0) for name, t in times.items()}
    diff = float((outputs["fp16"] - outputs["fp32"]).abs().max())
    scale = float(outputs["fp32"].abs().max())
    reading = gpu_free(device.index or 0) if cuda else None
    decision = decide_gpu_variant("fp16", reading, args.margin_mib * MIB)
    report = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "shape": args.shape,
        "latent": args.latent,
        "batch": args.batch,
        "iters": args.iters,
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "median_ms": median,
        "min_ms": {name: float(np.min(t) * 1000.0) for name, t in times.items()},
        "peak_mib": peak,
        "speedup_fp16": median["fp32"] / median["fp16"],
        "max_abs_diff_fp16": diff,
        "rel_diff_fp16": diff / max(scale, 1e-12),
        "free_mib": None if reading is None else reading.free_bytes / MIB,
        "free_source": None if reading is None else reading.source,
        "fallback_decision": {"variant": decision.variant, "reason": decision.reason},
        "tensorrt": _tensorrt(),
    }
    for name in models:
        memory = f", peak {peak[name]:.0f} MiB" if peak[name] is not None else ""
        log(
            f"[{args.shape} unet {report['device']}] {name}: {median[name]:.2f} ms per step{memory}"
        )
    report["verdict"] = [
        f"[{args.shape} unet] FP16 vs FP32 per step (latent {args.latent}, batch {args.batch}): "
        f"x{report['speedup_fp16']:.2f}; max|diff| {diff:.2e} (rel {report['rel_diff_fp16']:.1e})",
        f"[fallback] fp16 at a {args.margin_mib} MiB margin -> {decision.variant} "
        f"({decision.reason})",
        f"[tensorrt] {report['tensorrt']}",
    ]
    from facefuse.gpu.bench import extend_report

    extend_report(report, args, models, device, shape, log)
    return report


def run(args) -> int:
    _check(args)
    report = bench(args, progress_log(args.json))
    print_report(report, args.json)
    return 0
