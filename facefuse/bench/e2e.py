"""``facefuse bench e2e``: facefuse against the two baselines a user would otherwise run.

One command, one run, the same model, inputs, strength and guidance for every contender:

- **baseline A** - a plain diffusers pipeline in-process: ``StableDiffusionInpaintPipeline``
  (PyTorch eager fp32, DDIM 50 steps, inpainting-style latent blending, no caches) on the same
  face composite and mask, pasted back the same way;
- **baseline B** - a naive Triton deployment: the same repository with dynamic batching off,
  one instance per model, DDIM 50, fp32, no prompt compression, no prefix cache, each UNet
  call one ONNX Runtime run on all threads (:func:`facefuse.export.variants.naive_repository`);
- **facefuse** - the default configuration;
- **previous** - an earlier build of this project (``--previous CHECKOUT``: a git worktree of
  an older commit with its own exported ``model_repository``), served by the same tritonserver
  with that checkout's ``facefuse`` package imported first by the stubs, so a change's
  latency is measured against the build before it on the same machine and in the same run.

For each concurrency: requests/s, p50/p95 latency, average UNet batch rows per execution (Triton
metrics), CPU-seconds per image, plus ratios. With ``in-process`` chosen, Triton's overhead is
measured on the same request sent through the server and run in-process (ORT sessions, no
server), in alternation at concurrency 1 (:func:`measure_overhead`).

With ``--rounds N`` the whole comparison runs N times, contenders in turn within each round, so
that a slow spell of a shared machine hits every contender rather than one; each ratio is then
the median of the N rounds' ratios (each measured within one round) and each table cell the
median of its N values (:func:`combine_rounds`); every round is kept in the JSON.
Writes ``reports/e2e-<model>.json`` and ``reports/e2e-<model>.png``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from facefuse.bench.loadgen import LoadResult, run_closed_loop, tree_cpu_seconds
from facefuse.core.contract import SOURCE_IMAGE, TARGET_IMAGE
from facefuse.core.metrics import sample_total, scrape

CONTENDERS = ("baseline-a", "baseline-b", "facefuse", "in-process", "supervised", "previous")
INSTRUCTION = (
    "Please make her smile and keep her short hair, soft studio lighting, highly detailed, "
    "ultra detailed, sharp focus, 8k, 4k, hd"
)
GUIDANCE = 7.5
BASELINE_STEPS = 50


@dataclass(frozen=True)
class Job:
    """The benchmark request: the photos and the STRENGTH every contender runs (facefuse's
    served ``default_strength``, so the default configuration is what is measured)."""

    source: bytes
    target: bytes
    strength: float


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "e2e",
        help="facefuse vs a plain diffusers pipeline vs a naive Triton deployment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", default="tiny", help="'faces', 'tiny', 'mid' or a diffusers SD 1.x folder"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 4],
        help="concurrency levels (default 1 4)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=0,
        help="requests per contender and level (default: 3 at concurrency 1, 2 per user above)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the whole comparison this many times, contenders in turn; ratios are the "
        "median of the rounds' ratios (default 1)",
    )
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated subset of {','.join(CONTENDERS)}",
    )
    parser.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="the 'previous' contender: a checkout of an earlier build with an exported "
        "model_repository/ (e.g. git worktree add /tmp/old COMMIT; facefuse export there)",
    )
    parser.add_argument(
        "--work-dir", type=Path, default=Path(".cache/bench"), help="exports live here"
    )
    parser.add_argument("--out", type=Path, default=Path("reports"), help="JSON and PNG go here")
    parser.set_defaults(func=run)


# ---------------------------------------------------------------- repositories


def exported_repository(model: str, work_dir: Path) -> Path:
    """The default repository for ``model``, exported once into ``work_dir`` (and again
    when :data:`~facefuse.export.repository.EXPORT_FORMAT` has changed since)."""
    from facefuse.export.repository import EXPORT_FORMAT, export_repository
    from facefuse.export.variants import copy_repository_sources
    from facefuse.models.loading import load_components

    name = re.sub(r"[^A-Za-z0-9_.-]", "_", str(model))
    repository = work_dir / name / "default"
    stamp = work_dir / name / "export-format"  # outside the repository Triton reads
    sources = Path(__file__).resolve().parents[2] / "model_repository"
    stale = not stamp.is_file() or stamp.read_text().strip() != str(EXPORT_FORMAT)
    if stale or not (repository / "facefusion" / "1" / "pipeline.json").exists():
        if repository.exists():
            import shutil

            shutil.rmtree(repository)
        copy_repository_sources(sources, repository)
        results = export_repository(load_components(model), repository)
        if not all(r.ok for r in results):
            raise RuntimeError(
                f"export parity failed: {[(r.name, r.max_abs_diff) for r in results]}"
            )
        stamp.write_text(str(EXPORT_FORMAT))
    else:  # an earlier export: today's configs and model.py, the same ONNX files
        copy_repository_sources(sources, repository, refresh=True)
    return repository


def unet_rows_and_execs(metrics_url: str) -> tuple[float, float]:
    text = scrape(metrics_url)
    return (
        sample_total(text, "nv_inference_count", model="unet"),
        sample_total(text, "nv_inference_exec_count", model="unet"),
    )


# ---------------------------------------------------------------- contenders


def remote_fusion(grpc_url: str, job: Job, steps: int | None = None):
    """``call(index)``: the benchmark request through the server (a gRPC client per thread)."""
    from facefuse.client import Client

    clients = threading.local()

    def call(index: int) -> None:
        if not hasattr(clients, "client"):
            clients.client = Client(grpc_url, "grpc")
        clients.client.fuse(
            job.source,
            job.target,
            INSTRUCTION,
            steps=steps,
            strength=job.strength,
            guidance=GUIDANCE,
            seed=index,
        )

    return call


def local_fusion(pipeline, job: Job):
    """``call(index)``: the benchmark request on an in-process pipeline, one at a time."""
    from facefuse.diffusion.pipeline import params_from

    lock = threading.Lock()

    def call(index: int) -> None:
        with lock:
            params = params_from(pipeline.default_steps, job.strength, GUIDANCE, index)
            pipeline.fuse_png(job.source, job.target, INSTRUCTION, params)

    return call


def run_server_contender(
    repository: Path,
    levels,
    counts,
    steps,
    job: Job,
    supervised: bool = False,
    python_path: Path | None = None,
) -> dict:
    """``supervised``: served as ``facefuse serve`` serves it, explicit model control and the
    supervisor at its defaults watching (issue 33: it must cost a healthy server nothing).
    ``python_path``: a checkout whose ``facefuse`` package the model stubs import instead."""
    from contextlib import nullcontext

    from facefuse.serving.server import LocalTritonServer, ServerConfig
    from facefuse.serving.supervisor import Supervision, SupervisorSettings

    log = repository.parent / f"{repository.name}-server.log"
    config = ServerConfig(
        repository=repository, model_control_explicit=supervised, python_path=python_path
    )
    with LocalTritonServer(config, log_path=log) as server:
        watch = (
            Supervision(server.http_url, server.process.pid, config.admin_key,
                        SupervisorSettings(), health_port=0, log=lambda line: None)
            if supervised else nullcontext()
        )  # fmt: skip
        with watch:
            return _measure_served(server, levels, counts, steps, job)


def _measure_served(server, levels, counts, steps, job: Job) -> dict:
    """Warm up, then each concurrency level in turn: {level: (result, summary)}."""
    out = {}
    call = remote_fusion(server.grpc_url, job, steps)
    # Warm-up, not measured: one round at the highest concurrency, so that every pipeline
    # instance has served once and the composing models have seen their batch shapes
    # (first requests pay lazy loads and ORT allocations: ~1 s each on the tiny model).
    run_closed_loop(call, max(levels), max(levels))
    for level, count in zip(levels, counts):
        rows0, execs0 = unet_rows_and_execs(server.metrics_url)
        result = run_closed_loop(
            call, level, count, cpu_clock=lambda: tree_cpu_seconds(server.process.pid)
        )
        rows1, execs1 = unet_rows_and_execs(server.metrics_url)
        summary = result.summary()
        summary["unet_rows_per_exec"] = round((rows1 - rows0) / max(1.0, execs1 - execs0), 2)
        out[level] = (result, summary)
    return out


def run_baseline_a(model: str, levels, counts, job: Job) -> dict:
    """A plain diffusers inpainting pipeline in-process, one request at a time (a lock).

    diffusers' inpainting pipeline takes only 4- or 9-channel UNets; for other latent spaces
    (the ``faces`` model's 32 TAEF2 channels) it is ``StableDiffusionImg2ImgPipeline`` on the
    same composite, the mask then applied by the same pixel paste-back: what a diffusers user
    would write for such a model, at the same UNet cost per step."""
    import numpy as np
    import torch
    from diffusers import (
        DDIMScheduler,
        StableDiffusionImg2ImgPipeline,
        StableDiffusionInpaintPipeline,
    )
    from PIL import Image

    from facefuse.face.fusion import paste_back, prepare_fusion
    from facefuse.face.imageio import decode_image, encode_png
    from facefuse.models.loading import load_components

    c = load_components(model)
    inpaint = c.unet.config.in_channels in (4, 9)
    kind = StableDiffusionInpaintPipeline if inpaint else StableDiffusionImg2ImgPipeline
    pipe = kind(
        vae=c.vae,
        text_encoder=c.text_encoder,
        tokenizer=c.tokenizer,
        unet=c.unet,
        scheduler=DDIMScheduler.from_config(c.scheduler_config),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    lock = threading.Lock()

    def call(index: int) -> None:
        with lock:
            target_rgb = decode_image(job.target, TARGET_IMAGE.name)
            source_rgb = decode_image(job.source, SOURCE_IMAGE.name)
            plan = prepare_fusion(source_rgb, target_rgb, c.image_size)
            image = Image.fromarray((plan.composite * 255).astype(np.uint8))
            inpaint_args = {}
            if inpaint:
                mask = Image.fromarray((plan.mask * 255).astype(np.uint8))
                inpaint_args = {"mask_image": mask, "height": c.image_size, "width": c.image_size}
            fused = pipe(
                prompt=INSTRUCTION,
                image=image,
                **inpaint_args,
                strength=job.strength,
                num_inference_steps=BASELINE_STEPS,
                guidance_scale=GUIDANCE,
                generator=torch.Generator().manual_seed(index),
                output_type="np",
            ).images[0]
            encode_png(paste_back(target_rgb, fused, plan))

    call(0)
    return {
        level: _with_summary(run_closed_loop(call, level, count))
        for level, count in zip(levels, counts)
    }


def served_parameters(repository: Path, model: str) -> dict[str, str]:
    """``model``'s config parameters as served on this machine (``runtime: auto`` resolved)."""
    from facefuse.export.configs import read
    from facefuse.runtime.openvino import resolve_auto

    config = read(repository / model / "config.pbtxt")
    params = {k: v.string_value for k, v in config.parameters.items()}
    return resolve_auto(params, repository / model / "1")


def served_runtimes(repository: Path) -> dict[str, tuple[str, str]]:
    """ONNX model name -> (``runtime``, ``openvino_precision``) as its config.pbtxt says
    (``auto`` resolved for this CPU), for the models whose config names a runtime (the others
    run on ONNX Runtime)."""
    from facefuse.runtime.variants import ONNX_MODELS

    out = {}
    for name in ONNX_MODELS:
        if not (repository / name / "config.pbtxt").is_file():
            continue
        params = served_parameters(repository, name)
        if runtime := params.get("runtime", ""):
            out[name] = (runtime, params.get("openvino_precision", "bf16"))
    return out


def in_process_pipeline(repository: Path):
    """facefuse's default loop on the repository's ONNX files, without a server; the loop
    runs as ``facefusion``'s config says (scheduler, DeepCache, ...), the UNet as ``unet``'s
    (served file, threads, parallel runs), each ONNX model on its configured runtime."""
    from facefuse.diffusion.manifest import PipelineManifest
    from facefuse.diffusion.pipeline import Pipeline, options_from_parameters
    from facefuse.diffusion.stages import local_stages
    from facefuse.export.configs import get_parameter, read

    manifest = PipelineManifest.load(repository / "facefusion" / "1" / "pipeline.json")
    unet = served_parameters(repository, "unet")
    served = unet.get("onnx_file", "")
    template = get_parameter(
        read(repository / "prompt_optimizer" / "config.pbtxt"), "prompt_template"
    )
    variant = "int8" if served == "model.int8.onnx" else "fp32"
    unet_parts = (int(unet.get("parallel_runs", "1")), int(unet.get("intra_op_threads", "0")))
    stages = local_stages(
        repository,
        variant=variant,
        template=template,
        unet_parts=unet_parts,
        runtimes=served_runtimes(repository),
    )
    pipeline = read(repository / "facefusion" / "config.pbtxt")
    params = {k: v.string_value for k, v in pipeline.parameters.items()}
    return Pipeline(stages, manifest, **options_from_parameters(params))


def run_in_process(repository: Path, levels, counts, job: Job) -> dict:
    """The optimised loop without a server: ORT sessions in this process."""
    call = local_fusion(in_process_pipeline(repository), job)
    call(0)
    return {
        level: _with_summary(run_closed_loop(call, level, count))
        for level, count in zip(levels, counts)
    }


def measure_overhead(repository: Path, pairs: int, warm_concurrency: int, job: Job) -> dict:
    """Triton's cost per request: the same request through the server and in-process, in
    alternation at concurrency 1, so that the machine's noise hits both sides alike.

    ``overhead_ms`` is the median of the per-pair differences (server - in-process). Both sides
    do the same work, pasting back and PNG encoding included (:meth:`Pipeline.fuse_png`); the
    server adds the gRPC transfers, the BLS calls between models and the batchers' waits."""
    import numpy as np

    from facefuse.serving.server import LocalTritonServer, ServerConfig

    local = local_fusion(in_process_pipeline(repository), job)
    log = repository.parent / f"{repository.name}-overhead-server.log"
    with LocalTritonServer(ServerConfig(repository=repository), log_path=log) as server:
        remote = remote_fusion(server.grpc_url, job)
        # warm-up as for the facefuse contender: every pipeline instance serves once
        run_closed_loop(remote, warm_concurrency, warm_concurrency)
        local(0)
        server_ms, local_ms = [], []
        for index in range(pairs):
            t0 = time.perf_counter()
            remote(index)
            t1 = time.perf_counter()
            local(index)
            t2 = time.perf_counter()
            server_ms.append((t1 - t0) * 1000)
            local_ms.append((t2 - t1) * 1000)
    server_p50 = float(np.median(server_ms))
    overhead = float(np.median(np.subtract(server_ms, local_ms)))
    return {
        "pairs": pairs,
        "triton_p50_ms": round(server_p50, 1),
        "in_process_p50_ms": round(float(np.median(local_ms)), 1),
        "overhead_ms": round(overhead, 1),
        "overhead_pct": round(100 * overhead / server_p50, 1),
    }


def _with_summary(result: LoadResult):
    return result, result.summary()


# ---------------------------------------------------------------- report


def ratios(results: dict, overhead: dict | None = None) -> dict:
    """The headline ratios, where both sides were measured; Triton's overhead from the paired
    measurement (:func:`measure_overhead`) when there is one."""
    out = {}

    def get(name, level, key):
        return results.get(name, {}).get(str(level), {}).get(key)

    pairs = [
        ("p50 speed-up vs baseline A, c=1", "baseline-a", 1, "p50_ms", True),
        ("p50 speed-up vs baseline B, c=1", "baseline-b", 1, "p50_ms", True),
        ("requests/s vs baseline B, c=4", "baseline-b", 4, "requests_per_s", False),
        ("requests/s vs baseline A, c=4", "baseline-a", 4, "requests_per_s", False),
        ("CPU-s per image, baseline B / facefuse, c=4", "baseline-b", 4, "cpu_s_per_image", True),
    ]
    for label, other, level, key, lower_is_better in pairs:
        mine, theirs = get("facefuse", level, key), get(other, level, key)
        if mine and theirs:
            out[label] = round(theirs / mine if lower_is_better else mine / theirs, 2)
    for level in (1, 4):  # issue 33: the supervisor costs a healthy server nothing
        mine, watched = get("facefuse", level, "p50_ms"), get("supervised", level, "p50_ms")
        if mine and watched:
            out[f"p50 latency, supervised / facefuse, c={level}"] = round(watched / mine, 3)
        mine = get("facefuse", level, "requests_per_s")
        watched = get("supervised", level, "requests_per_s")
        if mine and watched:
            out[f"requests/s, supervised / facefuse, c={level}"] = round(watched / mine, 3)
    for level in (1, 4):  # a change against the build before it (--previous)
        mine, before = get("facefuse", level, "p50_ms"), get("previous", level, "p50_ms")
        if mine and before:
            out[f"p50 latency, facefuse / previous, c={level}"] = round(mine / before, 3)
    if overhead:
        out["Triton overhead per request, ms (c=1, paired median)"] = overhead["overhead_ms"]
        out["Triton overhead, % of end-to-end (c=1, paired median)"] = overhead["overhead_pct"]
        return out
    mine, base = get("facefuse", 1, "p50_ms"), get("in-process", 1, "p50_ms")
    if mine and base:
        out["Triton overhead per request, ms (c=1 p50)"] = round(mine - base, 1)
        out["Triton overhead, % of end-to-end (c=1 p50)"] = round(100 * (mine - base) / mine, 1)
    return out


SUMMED_OVER_ROUNDS = ("requests", "failures", "pairs")


def combine_rounds(rounds: list[dict]) -> tuple[dict, dict, dict | None]:
    """(results, ratios, overhead) over rounds of ``{"results", "ratios", "overhead_paired"}``.

    Each results cell and overhead figure is the median of its values over the rounds that
    have it, except the counts in :data:`SUMMED_OVER_ROUNDS` (one failed request in any round
    shows); each ratio is the median of the per-round ratios (a ratio is only ever taken
    between figures of the same round). One round gives back that round unchanged."""
    import statistics

    def median_cells(dicts: list[dict]) -> dict:
        out: dict = {}
        for key in dict.fromkeys(k for d in dicts for k in d):
            values = [d[key] for d in dicts if key in d]
            if all(isinstance(v, dict) for v in values):
                out[key] = median_cells(values)
            elif len(values) > 1 and key in SUMMED_OVER_ROUNDS:
                out[key] = sum(values)
            elif len(values) > 1 and all(isinstance(v, (int, float)) for v in values):
                out[key] = round(statistics.median(values), 4)
            else:  # one value, or not a number: the first round's
                out[key] = values[0]
        return out

    results = median_cells([r["results"] for r in rounds])
    ratio_values = median_cells([r["ratios"] for r in rounds])
    overheads = [r["overhead_paired"] for r in rounds if r.get("overhead_paired")]
    overhead = median_cells(overheads) if overheads else None
    return results, ratio_values, overhead


def write_chart(results: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in CONTENDERS if n in results]
    levels = sorted({int(level) for r in results.values() for level in r})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs = [j + i * width for j in range(len(levels))]
        p50 = [results[name].get(str(lv), {}).get("p50_ms", 0) / 1000 for lv in levels]
        rps = [results[name].get(str(lv), {}).get("requests_per_s", 0) for lv in levels]
        left.bar(xs, p50, width, label=name)
        right.bar(xs, rps, width, label=name)
    for axis, label in (
        (left, "p50 latency (s, lower is better)"),
        (right, "requests/s (higher is better)"),
    ):
        axis.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(levels))])
        axis.set_xticklabels([f"concurrency {lv}" for lv in levels])
        axis.set_ylabel(label)
    left.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_round(model, repositories: dict[str, Path], chosen, levels, counts, job: Job, started):
    """Every chosen contender once, in turn: (results by contender, paired overhead or None).

    ``repositories``: "facefuse" and, when baseline B runs, "baseline-b" (written once per
    command, not per round)."""
    repository = repositories["facefuse"]
    results: dict[str, dict] = {}
    overhead = None
    for name in chosen:
        print(f"[{time.perf_counter() - started:6.0f} s] running {name} ...", flush=True)
        if name == "baseline-a":
            runs = run_baseline_a(model, levels, counts, job)
        elif name == "baseline-b":
            naive = repositories["baseline-b"]
            runs = run_server_contender(naive, levels, counts, BASELINE_STEPS, job)
        elif name in ("facefuse", "supervised"):
            runs = run_server_contender(repository, levels, counts, None, job, name == "supervised")
        elif name == "previous":
            old = repositories["previous"]
            runs = run_server_contender(old, levels, counts, None, job, python_path=old.parent)
        else:
            runs = run_in_process(repository, [1], [counts[0]], job)
            overhead = measure_overhead(repository, counts[0] + 2, max(levels), job)
            print(json.dumps({"overhead (paired)": overhead}, indent=1), flush=True)
        results[name] = {str(level): summary for level, (_, summary) in runs.items()}
        print(json.dumps(results[name], indent=1), flush=True)
    return results, overhead


def run(args: argparse.Namespace) -> int:
    from facefuse.core.samples import sample_pair
    from facefuse.export.variants import naive_repository

    chosen = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = sorted(set(chosen) - set(CONTENDERS))
    if unknown:
        print(f"--contenders: unknown {unknown}; expected some of {CONTENDERS}", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print(f"--rounds: must be at least 1, got {args.rounds}", file=sys.stderr)
        return 2
    old = args.previous / "model_repository" if args.previous else None
    if "previous" in chosen and (old is None or not list(old.glob("*/1/*.onnx"))):
        print("--previous: the 'previous' contender needs a checkout with an exported "
              "model_repository/ (facefuse export run there)", file=sys.stderr)  # fmt: skip
        return 2
    levels = sorted(set(args.concurrency))
    counts = [args.requests or (3 if lv == 1 else 2 * lv) for lv in levels]
    started = time.perf_counter()
    repository = exported_repository(args.model, args.work_dir)
    repositories = {"facefuse": repository, **({"previous": old} if old else {})}
    if "baseline-b" in chosen:
        repositories["baseline-b"] = naive_repository(repository, repository.parent / "naive")
    from facefuse.diffusion.pipeline import options_from_parameters

    served = options_from_parameters(served_parameters(repository, "facefusion"))
    job = Job(*sample_pair(), strength=served["default_strength"])
    rounds = []
    for number in range(1, args.rounds + 1):
        if args.rounds > 1:
            print(f"[{time.perf_counter() - started:6.0f} s] round {number} of {args.rounds}")
        results, overhead = run_round(
            args.model, repositories, chosen, levels, counts, job, started
        )
        rounds.append(
            {"results": results, "overhead_paired": overhead, "ratios": ratios(results, overhead)}
        )
    results, headline, overhead = combine_rounds(rounds)
    report = {
        "model": str(args.model),
        "instruction": INSTRUCTION,
        "strength": job.strength,
        "guidance": GUIDANCE,
        "rounds_run": args.rounds,
        "results": results,
        "overhead_paired": overhead,
        "ratios": headline,
        "rounds": rounds if args.rounds > 1 else None,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(str(args.model)).name)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"e2e-{name}.json").write_text(json.dumps(report, indent=2))
    write_chart(results, args.out / f"e2e-{name}.png", f"facefuse bench e2e, model {name}")
    print_table(report)
    print(f"wrote {args.out / f'e2e-{name}.json'} and {args.out / f'e2e-{name}.png'}")
    return 0


def print_table(report: dict) -> None:
    keys = (
        "requests_per_s",
        "p50_ms",
        "p95_ms",
        "unet_rows_per_exec",
        "cpu_s_per_image",
        "failures",
    )
    print(f"{'contender':<12} {'conc':>4} " + " ".join(f"{k:>18}" for k in keys))
    for name, levels in report["results"].items():
        for level, summary in levels.items():
            cells = " ".join(f"{summary.get(k, '-')!s:>18}" for k in keys)
            print(f"{name:<12} {level:>4} {cells}")
    rounds = report.get("rounds") or []
    if rounds:
        print(f"cells and ratios: medians over {len(rounds)} rounds (ratios taken within a round)")
    for label, value in report["ratios"].items():
        spread = [r["ratios"][label] for r in rounds if label in r["ratios"]]
        suffix = f"  (rounds: {', '.join(str(v) for v in spread)})" if spread else ""
        print(f"{label}: {value}{suffix}")
