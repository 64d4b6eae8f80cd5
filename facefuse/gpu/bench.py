"""The GPU-runtime part of ``facefuse bench gpu`` (issue 21): batch scaling and img2img.

- UNet rows/s per batch size (``--batches``, default 1,2,4,8,16) in FP32 and FP16, eager and
  replayed from CUDA graphs (:class:`~facefuse.gpu.runtime.GraphRunner`), plus the max abs
  difference of graph replay to eager (FP16, batch 2).
- One img2img request (``--image`` px, strength 0.5, 20 steps DPM++ -> 10 UNet calls of batch
  2 with CFG, VAE encode + decode, text encoder), median latency of diffusers'
  ``StableDiffusionImg2ImgPipeline`` FP16 eager vs the facefuse GPU path (FP16 + CUDA graphs,
  :class:`~facefuse.gpu.img2img.GpuImg2Img`), and the requests/s of ``--concurrency`` requests
  run as one batch (16 UNet rows per call at 8) on both sides.

All measured side by side in one run. ``python -m facefuse.gpu.bench ARGS`` is the same as
``facefuse bench gpu ARGS`` (for a host where the console script is not installed).
"""

from __future__ import annotations

import copy
import time

import numpy as np


def add_arguments(parser) -> None:
    parser.add_argument(
        "--batches",
        default=None,
        help="UNet batch sizes for the rows/s table (default 1,2,4,8,16; 1,2 on a CPU)",
    )
    parser.add_argument(
        "--graphs",
        choices=("auto", "on", "off"),
        default="auto",
        help="CUDA graphs for the graph rows and the facefuse path (auto: on with CUDA)",
    )
    parser.add_argument("--no-e2e", dest="e2e", action="store_false", help="skip img2img")
    parser.add_argument("--e2e-iters", type=int, default=0, help="timed img2img runs (0: iters)")
    parser.add_argument(
        "--concurrency", type=int, default=None, help="requests in one batch (8; 2 on a CPU)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--strength", type=float, default=0.5)
    parser.add_argument(
        "--channels-last", action="store_true", help="also time the FP16 UNet in channels_last"
    )


def _batches(raw: str) -> list[int]:
    from facefuse.core.errors import InvalidInput

    try:
        sizes = sorted({int(p) for p in raw.split(",") if p.strip()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise InvalidInput("--batches", f"must list batch sizes >= 1 such as 1,2,4,8,16: {raw!r}")
    return sizes


def _timer(cuda: bool):
    import torch

    def timed(fn, iters: int, warmup: int = 2) -> list[float]:
        for _ in range(warmup):
            fn()
        if cuda:
            torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return times

    return timed


def unet_table(args, models: dict, device, log) -> dict:
    """Rows/s per batch size, precision and mode (eager / graph) for the UNet."""
    import torch

    from facefuse.gpu.runtime import GraphRunner, forward_fn

    cuda = device.type == "cuda"
    graphs = args.graphs == "on" or (args.graphs == "auto" and cuda)
    timed = _timer(cuda)
    batches = _batches(args.batches)
    text = models["fp32"].config.cross_attention_dim
    rng = np.random.default_rng(args.seed)
    table: dict = {}
    variants = [(name, model, False) for name, model in models.items()]
    if args.channels_last and cuda:
        cl = copy.deepcopy(models["fp16"]).to(memory_format=torch.channels_last)
        variants.append(("fp16_channels_last", cl, True))
    for name, model, _ in variants:
        dtype = next(model.parameters()).dtype
        fn = forward_fn("unet", {"unet": model})
        modes = {"eager": None}
        if graphs:
            modes["graph"] = GraphRunner(fn, batches, enabled=True, name=f"unet-{name}")
        for mode, runner in modes.items():
            rows = {}
            for b in batches:
                feed = (
                    torch.from_numpy(rng.standard_normal((b, 4, args.latent, args.latent)))
                    .to(device, dtype)
                    .contiguous(),
                    torch.full((b,), 500.0, device=device, dtype=dtype),
                    torch.from_numpy(rng.standard_normal((b, 77, text))).to(device, dtype),
                )
                try:
                    if runner is None:

                        def call(feed=feed, fn=fn):
                            with torch.inference_mode():
                                fn(*feed)

                    else:

                        def call(feed=feed, runner=runner):
                            runner(*feed)

                    times = timed(call, args.iters)
                except Exception as exc:  # an OOM at batch 16 FP32 must not lose the rest
                    rows[str(b)] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
                    log(f"[unet {name} {mode}] batch {b}: {rows[str(b)]['error']}")
                    continue
                ms = float(np.median(times) * 1000.0)
                rows[str(b)] = {"ms": round(ms, 3), "rows_per_s": round(b / ms * 1000.0, 2)}
                log(f"[unet {name} {mode}] batch {b}: {ms:.2f} ms, {b / ms * 1000:.1f} rows/s")
            table[f"{name}_{mode}"] = rows
            if runner is not None:
                table[f"{name}_{mode}_status"] = runner.status()
    if graphs and 2 in batches:
        table["graph_vs_eager_fp16_batch2_max_abs_diff"] = _graph_diff(models["fp16"], args, device)
    return table


def _graph_diff(model, args, device) -> float:
    import torch

    from facefuse.gpu.runtime import GraphRunner, forward_fn

    fn = forward_fn("unet", {"unet": model})
    dtype = next(model.parameters()).dtype
    text = model.config.cross_attention_dim
    gen = torch.Generator(device).manual_seed(args.seed)
    feed = (
        torch.randn((2, 4, args.latent, args.latent), generator=gen, device=device).to(dtype),
        torch.tensor([700.0, 700.0], device=device, dtype=dtype),
        torch.randn((2, 77, text), generator=gen, device=device).to(dtype),
    )
    with torch.inference_mode():
        eager = fn(*feed)[0].float()
    graphed = GraphRunner(fn, (2,), name="unet-diff")(*feed)[0].float()
    return float((graphed - eager).abs().max())


def img2img(args, shape, device, log) -> dict:
    """The single-request latency and batched throughput of both img2img paths."""
    import torch

    from facefuse.gpu.img2img import GpuImg2Img, diffusers_img2img, run_diffusers
    from facefuse.gpu.runtime import build_modules
    from facefuse.prompt.tokenizer import build_clip_tokenizer

    cuda = device.type == "cuda"
    graphs = args.graphs == "on" or (args.graphs == "auto" and cuda)
    dtype = torch.float16 if cuda else torch.float32  # FP16 convolutions crawl on a CPU
    timed = _timer(cuda)
    iters = args.e2e_iters or min(args.iters, 10)
    t0 = time.perf_counter()
    modules = build_modules(f"seeded:{args.shape}", ["unet", "vae", "text_encoder"], device)
    for module in modules.values():
        module.to(dtype)
    build_s = time.perf_counter() - t0
    tokenizer = build_clip_tokenizer()
    side = args.latent * 8
    rng = np.random.default_rng(args.seed)
    n = args.concurrency
    images = rng.integers(0, 256, (n, side, side, 3), dtype=np.uint8)
    prompts = [f"portrait photo of person {i}, smiling, detailed face" for i in range(n)]
    kw = {"steps": args.steps, "strength": args.strength, "guidance": 7.5, "seed": args.seed}
    ours = GpuImg2Img(modules, tokenizer, device, dtype, graphs=graphs)
    pipe = diffusers_img2img(modules, tokenizer)
    report: dict = {
        "dtype": str(dtype).replace("torch.", ""),
        "image": side,
        "steps": args.steps,
        "strength": args.strength,
        "unet_calls": min(int(args.steps * args.strength), args.steps),
        "concurrency": n,
        "iters": iters,
        "build_s": round(build_s, 2),
        "graphs": graphs,
    }
    prec = "fp16" if dtype == torch.float16 else "fp32"
    runs = {
        f"diffusers_{prec}_eager": lambda k: run_diffusers(pipe, images[:k], prompts[:k], **kw),
        f"facefuse_{prec}_{'graphs' if graphs else 'eager'}": lambda k: ours(
            images[:k], prompts[:k], **kw
        ),
    }
    report["paths"] = list(runs)
    outputs = {}
    for name, fn in runs.items():
        t0 = time.perf_counter()
        outputs[name] = fn(1)  # the first call captures the graphs of batch 1/2
        fn(n)  # and of batch n/2n
        first_s = time.perf_counter() - t0
        one = timed(lambda fn=fn: fn(1), iters, warmup=1)
        many = timed(lambda fn=fn: fn(n), max(2, iters // 2), warmup=1)
        report[name] = {
            "single_ms_p50": round(float(np.median(one) * 1000), 2),
            "single_ms_min": round(float(np.min(one) * 1000), 2),
            f"batch{n}_ms_p50": round(float(np.median(many) * 1000), 2),
            f"batch{n}_requests_per_s": round(n / float(np.median(many)), 2),
            "first_calls_s": round(first_s, 2),
        }
        log(f"[img2img {name}] {report[name]}")
    base, fast = list(runs)
    report["speedup_single"] = round(
        report[base]["single_ms_p50"] / report[fast]["single_ms_p50"], 3
    )
    report[f"speedup_batch{n}"] = round(
        report[fast][f"batch{n}_requests_per_s"] / report[base][f"batch{n}_requests_per_s"], 3
    )
    a, b = (outputs[k].astype(np.float32) for k in runs)
    # different noise draws (diffusers samples the VAE posterior): a sanity bound, not equality
    report["mean_abs_diff_uint8_vs_diffusers"] = round(float(np.abs(a - b).mean()), 2)
    report["facefuse_graph_status"] = ours.status()
    return report


def check_arguments(args, cuda: bool | None = None) -> None:
    """Fill the device-dependent defaults and refuse bad values before anything is built."""
    from facefuse.core.errors import InvalidInput

    if cuda is None:
        cuda = str(args.device).startswith("cuda")
    if args.batches is None:
        args.batches = "1,2,4,8,16" if cuda else "1,2"
    _batches(args.batches)
    if args.concurrency is None:
        args.concurrency = 8 if cuda else 2
    if args.concurrency < 1 or args.steps < 1 or not 0 < args.strength <= 1:
        raise InvalidInput("--concurrency/--steps/--strength", "need >= 1, >= 1 and (0, 1]")


def extend_report(report: dict, args, models: dict, device, shape, log) -> None:
    """Add the issue-21 sections to the ``facefuse bench gpu`` report (and verdict lines)."""
    check_arguments(args, device.type == "cuda")
    report["unet_batches"] = unet_table(args, models, device, log)
    lines = []
    for key in ("fp16_graph", "fp16_eager", "fp32_graph", "fp32_eager"):
        rows = report["unet_batches"].get(key)
        if rows:
            cells = ", ".join(
                f"b{b} {r['rows_per_s']:.0f}" for b, r in rows.items() if "rows_per_s" in r
            )
            lines.append(f"[unet rows/s {key}] {cells}")
    if args.e2e:
        try:
            report["img2img"] = img2img(args, shape, device, log)
        except Exception as exc:  # keep the UNet table when the end-to-end part fails
            report["img2img"] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
            lines.append(f"[img2img] failed: {report['img2img']['error']}")
            log(lines[-1])
            report["verdict"] = [*report.get("verdict", []), *lines]
            return
        e2e = report["img2img"]
        n = args.concurrency
        for name in e2e["paths"]:
            if name in e2e:
                lines.append(
                    f"[img2img {name}] one request {e2e[name]['single_ms_p50']:.1f} ms; "
                    f"{n} batched {e2e[name][f'batch{n}_requests_per_s']:.2f} req/s"
                )
        lines.append(
            f"[img2img] facefuse vs diffusers: x{e2e['speedup_single']:.2f} latency, "
            f"x{e2e[f'speedup_batch{n}']:.2f} throughput at {n}"
        )
    report["verdict"] = [*report.get("verdict", []), *lines]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    from facefuse.bench import gpu
    from facefuse.core.errors import FacefuseError

    parser = argparse.ArgumentParser(prog="python -m facefuse.gpu.bench")
    sub = parser.add_subparsers(dest="bench", required=True)
    gpu.register(sub)
    args = parser.parse_args(["gpu", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except FacefuseError as exc:
        print(f"facefuse bench gpu: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
