"""``facefuse bench unet``: the light-model levers, measured side by side in one run.

1. **Per UNet call** on SD-1.5-shaped random weights (860M parameters) at a 32x32 latent,
   batch 2 (one classifier-free-guidance step): ONNX Runtime fp32 (the plain export), fp32
   with attention fused for the CPU (:mod:`facefuse.export.attention`), the served INT8 file
   (fused, then dynamic INT8 of MatMul/Gemm weights; ``--with-conv`` adds a variant that also
   quantises Conv), and PyTorch eager fp32, all with the same thread count, calls interleaved
   round-robin so that machine noise hits every backend alike. The fp32 export (~3.4 GB,
   external data) and the derived files are cached under ``--workdir`` and reused.
2. **End to end** face fusion on ``--e2e-model`` (default tiny; ``mid`` is UNet-dominated like
   SD 1.5; in-process ORT stages, the sample photos,
   fixed seed): the baseline fp32 + DDIM 50 steps (one ORT run on all threads per UNet call)
   against DPM-Solver++ 20 steps and adaptive steps, for fp32 and INT8 UNet files, and the
   served default (INT8, DPM++ 20, the UNet's rows in ``--parallel-runs`` slices as the served
   ``unet`` runs them), interleaved; ratios are baseline / candidate medians. The baseline
   with the same parallel runs is timed too, so that the steps and precision gain alone shows.
3. **Parallel runs** of the end-to-end model's UNet (fp32 and INT8 files, batches 2 and 8):
   one run on all threads against ``--parallel-runs`` row slices run side by side with the
   threads shared out, as the served ``unet`` does (``facefuse.runtime.sessions.PartsRunner``);
   interleaved, ratio = one run / parallel runs, plus the max abs difference of the outputs.

Prints ratios; ``--json`` prints the whole report.
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import numpy as np

from facefuse.bench import print_report, progress_log
from facefuse.core.contract import ENCODER_HIDDEN_STATES, SAMPLE, TIMESTEP

INSTRUCTION = "a smiling portrait, natural light, sharp focus"
TARGET_UNET_VS_ORT = 1.5  # issue 21 (issue 5 asked for 1.2)
TARGET_UNET_VS_TORCH = 1.5
TARGET_E2E = 3.0
BASELINE = "baseline fp32 ddim-50"
SERVED = "served: int8 dpm++-20, parallel runs"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "unet",
        help="UNet per call (ORT fp32 / INT8 / PyTorch) on SD-1.5 shapes + end-to-end fusion",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--iters", type=int, default=5, help="timed UNet calls per backend")
    parser.add_argument("--e2e-iters", type=int, default=3, help="timed fusions per config")
    parser.add_argument("--threads", type=int, default=0, help="threads (0 = all cores)")
    parser.add_argument("--latent", type=int, default=32, help="latent side for the UNet calls")
    parser.add_argument("--batch", type=int, default=2, help="UNet batch (2 = one CFG step)")
    parser.add_argument(
        "--openvino", action="store_true", help="also time the fp32 export on OpenVINO bf16"
    )
    parser.add_argument("--with-conv", action="store_true", help="also time INT8 incl. Conv")
    parser.add_argument("--skip-sd15", action="store_true", help="only the end-to-end part")
    parser.add_argument("--skip-e2e", action="store_true", help="only the per-call part")
    parser.add_argument("--workdir", type=Path, default=Path(".cache/bench/unet"))
    parser.add_argument(
        "--e2e-model", default="tiny", help="'tiny', 'mid' or a diffusers SD 1.x folder"
    )
    parser.add_argument(
        "--e2e-work-dir",
        type=Path,
        default=Path(".cache/bench"),
        help="the end-to-end model's export (shared with bench e2e)",
    )
    parser.add_argument(
        "--parallel-runs",
        type=int,
        default=2,
        help="row slices run side by side, as the served unet does, in the parallel-runs part "
        "and the served end-to-end configs (1 skips both)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(func=run)


def _stats(times_s: list[float]) -> dict[str, float]:
    ms = np.asarray(times_s) * 1000.0
    return {
        "median_ms": float(np.median(ms)),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
        "n": len(ms),
    }


def _threads(args) -> int:
    from facefuse.runtime.sessions import usable_cores

    return args.threads or usable_cores()


def _session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _prepare_sd15(args, log) -> tuple[Path, dict[str, Path]]:
    """Export (or reuse) the SD-1.5-shaped UNet and its INT8 variants; returns paths."""
    import onnxruntime
    import torch

    from facefuse.export.onnx_export import export_unet
    from facefuse.export.quantize import DEFAULT_OP_TYPES, fuse_attention_contained, fused_int8
    from facefuse.models.tiny import SD15, build_unet

    folder = args.workdir / f"sd15-seed{args.seed}"
    stamp = folder / "stamp.json"
    fp32 = folder / "fp32" / "unet.onnx"
    want = {"seed": args.seed, "torch": torch.__version__}
    if not (stamp.is_file() and json.loads(stamp.read_text()) == want and fp32.is_file()):
        t0 = time.perf_counter()
        unet = build_unet(SD15, args.seed)
        result = export_unet(unet, fp32, args.latent, SD15.text_hidden)
        del unet
        gc.collect()
        stamp.write_text(json.dumps(want))
        log(
            f"[sd15] exported fp32 UNet in {time.perf_counter() - t0:.0f} s "
            f"(parity max|diff| {result.max_abs_diff:.1e}, ok={result.ok})"
        )
    variants: dict[str, tuple[str, ...]] = {"fp32-fused": (), "int8": DEFAULT_OP_TYPES}
    if args.with_conv:
        variants["int8-conv"] = (*DEFAULT_OP_TYPES, "Conv")
    paths = {}
    for name, op_types in variants.items():
        path = folder / name / "unet.onnx"
        vstamp = path.parent / "stamp.json"
        vwant = {
            **want,
            "ort": onnxruntime.__version__,
            "op_types": list(op_types),
            "fused_attention": True,
        }
        if not (vstamp.is_file() and json.loads(vstamp.read_text()) == vwant and path.is_file()):
            t0 = time.perf_counter()
            if op_types:
                fused_int8(fp32, path, op_types)
            else:
                fuse_attention_contained(fp32, path)
            vstamp.write_text(json.dumps(vwant))
            log(
                f"[sd15] wrote {name} (attention fused; INT8: {'+'.join(op_types) or 'none'}) "
                f"in {time.perf_counter() - t0:.0f} s"
            )
        paths[name] = path
    return fp32, paths


def bench_sd15(args, log) -> dict:
    import torch

    from facefuse.models.tiny import SD15, build_unet

    threads = _threads(args)
    fp32, derived = _prepare_sd15(args, log)
    torch.set_num_threads(threads)
    rng = np.random.default_rng(args.seed)
    sample = rng.standard_normal((args.batch, 4, args.latent, args.latent)).astype(np.float32)
    timestep = np.array([500.0] * args.batch, dtype=np.float32)
    context = rng.standard_normal((args.batch, 77, SD15.text_hidden)).astype(np.float32)
    feeds = {SAMPLE.name: sample, TIMESTEP.name: timestep, ENCODER_HIDDEN_STATES.name: context}

    unet = build_unet(SD15, args.seed)
    tensors = [torch.from_numpy(a) for a in (sample, timestep, context)]

    def torch_call():
        with torch.inference_mode():
            return unet(*tensors, return_dict=False)[0].numpy()

    backends = {"torch-eager-fp32": torch_call}
    sessions = {"ort-fp32": _session(fp32, threads)}
    sessions.update({f"ort-{k}": _session(p, threads) for k, p in derived.items()})
    if args.openvino:  # the plain fp32 export under OpenVINO bf16 (AMX / AVX-512 BF16 CPUs)
        from facefuse.runtime.openvino import OpenVinoSession

        sessions["openvino-bf16"] = OpenVinoSession(fp32, threads, "bf16")
    for name, session in sessions.items():
        backends[name] = lambda s=session: s.run(None, feeds)[0]
    outputs = {name: call() for name, call in backends.items()}  # warm-up (allocations)
    reference = outputs["torch-eager-fp32"]
    scale = float(np.abs(reference).max())
    times: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(args.iters):
        for name, call in backends.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    stats = {name: _stats(t) for name, t in times.items()}
    for name in backends:
        diff = float(np.abs(outputs[name] - reference).max())
        stats[name]["max_abs_diff_vs_torch"] = diff
        stats[name]["rel_diff_vs_torch"] = diff / max(scale, 1e-12)
        log(
            f"[sd15] {name:<18} median {stats[name]['median_ms']:9.1f} ms "
            f"(min {stats[name]['min_ms']:.1f}, max {stats[name]['max_ms']:.1f})  "
            f"max|diff| vs torch {diff:.2e} (rel {diff / max(scale, 1e-12):.1e})"
        )
    best = min((n for n in stats if n.startswith("ort-int8")), key=lambda n: stats[n]["median_ms"])
    median = {n: s["median_ms"] for n, s in stats.items()}
    return {
        "shape": "sd15",
        "latent": args.latent,
        "batch": args.batch,
        "threads": threads,
        "backends": stats,
        "best_int8": best,
        "ratios": {
            "ort_fp32_over_best_int8": median["ort-fp32"] / median[best],
            "torch_fp32_over_best_int8": median["torch-eager-fp32"] / median[best],
            "torch_fp32_over_ort_fp32": median["torch-eager-fp32"] / median["ort-fp32"],
            "ort_fp32_over_fp32_fused": median["ort-fp32"] / median["ort-fp32-fused"],
            **(
                {"ort_fp32_over_openvino_bf16": median["ort-fp32"] / median["openvino-bf16"]}
                if "openvino-bf16" in median
                else {}
            ),
        },
    }


def bench_e2e(args, log, repo: Path) -> dict:
    """End-to-end fusion configurations on the exported repository ``repo``."""
    from facefuse.core.samples import sample_pair
    from facefuse.diffusion.manifest import MANIFEST_NAME, PipelineManifest
    from facefuse.diffusion.pipeline import Pipeline, params_from
    from facefuse.diffusion.stages import local_stages
    from facefuse.runtime.sessions import threads_per_part

    threads = _threads(args)
    log(f"[{args.e2e_model} e2e] repository {repo} (fp32 and INT8 UNet)")
    manifest = PipelineManifest.load(repo / "facefusion" / "1" / MANIFEST_NAME)
    source, target = sample_pair()
    parts = args.parallel_runs
    # name -> (variant, scheduler, steps or None for adaptive, CFG truncation, UNet runs)
    configs = {
        BASELINE: ("fp32", "ddim", 50, 0.0, 1),
        "fp32 dpm++-20": ("fp32", "dpm++", 20, 0.0, 1),
        "int8 dpm++-20": ("int8", "dpm++", 20, 0.0, 1),
        "fp32 dpm++-adaptive": ("fp32", "dpm++", None, 0.0, 1),
        "int8 dpm++-adaptive": ("int8", "dpm++", None, 0.0, 1),
        # not a default: the option, measured (unconditional half skipped in the last 30%)
        "int8 dpm++-20 cfg-trunc-0.3": ("int8", "dpm++", 20, 0.3, 1),
    }
    if parts > 1:  # the UNet as the served `unet` runs it, and the baseline given the same
        configs[SERVED] = ("int8", "dpm++", 20, 0.0, parts)
        configs[f"fp32 ddim-50 {parts} runs"] = ("fp32", "ddim", 50, 0.0, parts)
    stages = {  # slices share the threads out as in bench_parts; one run keeps them all
        (variant, runs): local_stages(
            repo,
            threads,
            variant=variant,
            unet_parts=(runs, threads_per_part(0, runs, cores=threads)) if runs > 1 else None,
        )
        for variant, runs in {(c[0], c[4]) for c in configs.values()}
    }
    pipelines = {
        name: Pipeline(
            stages[variant, runs],
            manifest,
            scheduler,
            adaptive_steps=steps is None,
            cfg_truncation=truncation,
        )
        for name, (variant, scheduler, steps, truncation, runs) in configs.items()
    }

    def call(name):
        steps = configs[name][2]
        params = params_from(steps=steps, seed=args.seed)
        return pipelines[name].fuse(source, target, INSTRUCTION, params, auto_steps=steps is None)

    for name in configs:  # warm-up: detector models, ORT allocations
        call(name)
    times: dict[str, list[float]] = {n: [] for n in configs}
    stage_ms: dict[str, list[dict]] = {n: [] for n in configs}
    infos = {}
    for _ in range(args.e2e_iters):
        for name in configs:
            t0 = time.perf_counter()
            image, _, _, info = call(name)
            times[name].append(time.perf_counter() - t0)
            stage_ms[name].append(info["stage_ms"])
            infos[name] = (image, info)
    baseline_image = infos[BASELINE][0]
    report = {}
    for name in configs:
        info = infos[name][1]
        stats = _stats(times[name])
        stats["steps"] = info["steps"]
        stats["steps_run"] = info["steps_run"]
        stats["unet_calls"] = info["unet_calls"]
        stats["stage_median_ms"] = {
            k: float(np.median([s.get(k, 0.0) for s in stage_ms[name]])) for k in stage_ms[name][0]
        }
        stats["denoise_median_ms"] = stats["stage_median_ms"].get("denoise", 0.0)
        stats["max_abs_pixel_diff_vs_baseline"] = float(
            np.abs(infos[name][0] - baseline_image).max()
        )
        report[name] = stats
        log(
            f"[{args.e2e_model} e2e] {name:<22} median {stats['median_ms']:8.1f} ms  "
            f"(denoise {stats['denoise_median_ms']:7.1f} ms, steps {info['steps']}, "
            f"unet calls {info['unet_calls']})"
        )
    base = report[BASELINE]
    candidates = [n for n, c in configs.items() if c[1] != "ddim" and not c[3]]
    best = min(candidates, key=lambda n: report[n]["median_ms"])
    like_for_like = {}
    if parts > 1:  # steps + precision alone: both sides run the UNet in the same slices
        like_for_like = {
            "baseline": f"fp32 ddim-50 {parts} runs",
            "candidate": SERVED,
            "end_to_end": report[f"fp32 ddim-50 {parts} runs"]["median_ms"]
            / report[SERVED]["median_ms"],
        }
    return {
        "model": args.e2e_model,
        "threads": threads,
        "like_for_like": like_for_like,
        "strength": params_from().strength,
        "configs": report,
        "best": best,
        "ratios": {
            name: {
                "end_to_end": base["median_ms"] / report[name]["median_ms"],
                "denoise": base["denoise_median_ms"] / max(report[name]["denoise_median_ms"], 1e-9),
            }
            for name in configs
            if name != BASELINE
        },
    }


PARTS_BATCHES = (2, 8)


def bench_parts(args, log, folder: Path) -> dict:
    """One UNet run on all threads vs ``--parallel-runs`` slices side by side (served config),
    on the fp32 and INT8 files in the version folder ``folder``."""
    from facefuse.runtime.sessions import (
        PartsRunner,
        SessionOptions,
        open_session,
        threads_per_part,
    )
    from facefuse.runtime.variants import onnx_file

    threads = _threads(args)
    parts = args.parallel_runs
    each = threads_per_part(0, parts, cores=threads)
    rng = np.random.default_rng(args.seed)
    report: dict = {"model": args.e2e_model, "threads": threads, "parts": parts, "runs": {}}
    for precision in ("fp32", "int8"):
        path = folder / onnx_file(precision)
        single = open_session(path, SessionOptions(threads))
        shared = open_session(path, SessionOptions(each))
        sliced = PartsRunner(lambda f, s=shared: s.run(None, f), parts)
        runners = {
            "one run": lambda feeds, s=single: s.run(None, feeds)[0],
            f"{parts} runs": lambda feeds, r=sliced: r(feeds)[0],
        }
        hidden = single.get_inputs()[2].shape[2]
        for batch in PARTS_BATCHES:
            feeds = {
                SAMPLE.name: rng.standard_normal((batch, 4, args.latent, args.latent)).astype(
                    np.float32
                ),
                TIMESTEP.name: np.full((batch,), 500.0, dtype=np.float32),
                ENCODER_HIDDEN_STATES.name: rng.standard_normal((batch, 77, hidden)).astype(
                    np.float32
                ),
            }
            outputs = {name: run(feeds) for name, run in runners.items()}  # warm-up
            times: dict[str, list[float]] = {name: [] for name in runners}
            for _ in range(args.iters):
                for name, run in runners.items():
                    t0 = time.perf_counter()
                    run(feeds)
                    times[name].append(time.perf_counter() - t0)
            stats = {name: _stats(t) for name, t in times.items()}
            one, many = (stats[name]["median_ms"] for name in runners)
            key = f"{precision} batch {batch}"
            report["runs"][key] = {
                "one_run": stats["one run"],
                "parallel_runs": stats[f"{parts} runs"],
                "speedup": one / many,
                "max_abs_diff": float(np.abs(outputs["one run"] - outputs[f"{parts} runs"]).max()),
            }
            log(
                f"[{args.e2e_model} unet] {key:<14} one run x{threads} threads {one:8.1f} ms, "
                f"{parts} runs x{each} {many:8.1f} ms: x{one / many:.2f}"
            )
    return report


def _verdict(report: dict) -> list[str]:
    lines = []
    sd15 = report.get("sd15")
    if sd15:
        r = sd15["ratios"]
        ok1 = r["ort_fp32_over_best_int8"] >= TARGET_UNET_VS_ORT
        ok2 = r["torch_fp32_over_best_int8"] >= TARGET_UNET_VS_TORCH
        lines.append(
            f"[sd15 unet] {sd15['best_int8']} vs ORT fp32: x{r['ort_fp32_over_best_int8']:.2f} "
            f"(target x{TARGET_UNET_VS_ORT}: {'yes' if ok1 else 'NO'})"
        )
        if "ort_fp32_over_openvino_bf16" in r:
            ratio = r["ort_fp32_over_openvino_bf16"]
            lines.append(
                f"[sd15 unet] openvino-bf16 vs ORT fp32: x{ratio:.2f} "
                f"(target x{TARGET_UNET_VS_ORT}: {'yes' if ratio >= TARGET_UNET_VS_ORT else 'NO'})"
            )
        lines.append(
            f"[sd15 unet] {sd15['best_int8']} vs PyTorch eager fp32: "
            f"x{r['torch_fp32_over_best_int8']:.2f} (target x{TARGET_UNET_VS_TORCH}: "
            f"{'yes' if ok2 else 'NO'}); ORT fp32 vs PyTorch: x{r['torch_fp32_over_ort_fp32']:.2f}"
        )
        lines.append(
            f"[sd15 unet] attention fusion alone (fp32 / fp32 fused): "
            f"x{r['ort_fp32_over_fp32_fused']:.2f}"
        )
    e2e = report.get("e2e")
    if e2e:
        tag = f"[{e2e['model']} e2e]"
        for name, ratio in e2e["ratios"].items():
            lines.append(
                f"{tag} ddim-50 fp32 / {name}: end-to-end x{ratio['end_to_end']:.2f}, "
                f"denoise x{ratio['denoise']:.2f}"
            )
        best = e2e["ratios"][e2e["best"]]["end_to_end"]
        lines.append(
            f"{tag} best default-quality config ({e2e['best']}) x{best:.2f} "
            f"(target x{TARGET_E2E}: "
            f"{'yes' if best >= TARGET_E2E else 'NO'})"
        )
        same = e2e.get("like_for_like")
        if same:
            lines.append(
                f"{tag} {same['baseline']} / {same['candidate']}: x{same['end_to_end']:.2f} "
                "(steps and precision alone, the same parallel runs on both sides)"
            )
    return lines


def run(args) -> int:
    log = progress_log(args.json)

    from facefuse.core.errors import InvalidInput

    if args.iters < 1 or args.e2e_iters < 1 or args.latent < 8 or args.latent % 8:
        raise InvalidInput(
            "--iters/--e2e-iters/--latent", "iterations >= 1 and a latent side divisible by 8"
        )
    if args.parallel_runs < 1:
        raise InvalidInput("--parallel-runs", f"must be >= 1, got {args.parallel_runs}")
    report: dict = {}
    if not args.skip_sd15:
        report["sd15"] = bench_sd15(args, log)
    if not args.skip_e2e:
        from facefuse.bench.e2e import exported_repository

        repository = exported_repository(args.e2e_model, args.e2e_work_dir)
        report["e2e"] = bench_e2e(args, log, repository)
        if args.parallel_runs > 1:
            report["parallel_runs"] = bench_parts(args, log, repository / "unet" / "1")
    report["verdict"] = _verdict(report)
    print_report(report, args.json)
    return 0
