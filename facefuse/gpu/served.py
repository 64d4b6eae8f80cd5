"""The served GPU measurement: a torch-cuda model repository, and its load over plain HTTP.

``python -m facefuse.gpu.served assemble --out DIR ...`` writes a repository of five models:
``text_encoder``, ``unet``, ``vae_encoder``, ``vae_decoder`` (the project's own ``model.py``
with ``configs/gpu-torch.pbtxt``, parameters overridden from the command line) and ``img2img``
(:mod:`facefuse.gpu.img2img_model`, the BLS pipeline, ``--instances`` pipelines at once).

``python -m facefuse.gpu.served measure --url HOST:PORT ...`` sends one img2img request at a
time (p50 of ``--single``), then ``--concurrency`` clients for ``--duration`` seconds, and
writes JSON: latency percentiles, requests/s, and the average ``unet`` batch from the
server's metrics. The client is the standard library's ``http.client`` speaking KServe v2
with binary tensors, so the GPU host needs no tritonclient.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import struct
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TORCH_MODELS = ("text_encoder", "unet", "vae_encoder", "vae_decoder")
CONFIG_NAME = "gpu-torch.pbtxt"

IMG2IMG_CONFIG = """\
# img2img over BLS (facefuse.gpu.img2img_model): image + prompt -> image; written by
# `python -m facefuse.gpu.served assemble`. {instances} instances = pipelines in flight at once.
name: "img2img"
backend: "python"
max_batch_size: 0
input [
  {{ name: "IMAGE", data_type: TYPE_UINT8, dims: [ -1, -1, 3 ] }},
  {{ name: "PROMPT", data_type: TYPE_STRING, dims: [ 1 ] }},
  {{ name: "STEPS", data_type: TYPE_INT32, dims: [ 1 ], optional: true }},
  {{ name: "STRENGTH", data_type: TYPE_FP32, dims: [ 1 ], optional: true }},
  {{ name: "GUIDANCE", data_type: TYPE_FP32, dims: [ 1 ], optional: true }},
  {{ name: "SEED", data_type: TYPE_INT64, dims: [ 1 ], optional: true }}
]
output [
  {{ name: "IMAGE", data_type: TYPE_UINT8, dims: [ -1, -1, 3 ] }},
  {{ name: "INFO", data_type: TYPE_STRING, dims: [ 1 ] }}
]
instance_group [ {{ count: {instances}, kind: KIND_CPU }} ]
parameters {{ key: "scheduler", value: {{ string_value: "dpm++" }} }}
"""


# ----------------------------------------------------------------------------- assemble
def set_parameter(text: str, key: str, value: str) -> str:
    """``text`` with parameter ``key`` set to ``value`` (replaced, or appended)."""
    line = f'parameters {{ key: "{key}", value: {{ string_value: "{value}" }} }}'
    pattern = re.compile(r'^parameters \{ key: "' + re.escape(key) + r'".*$', re.M)
    if pattern.search(text):
        return pattern.sub(line, text)
    return text.rstrip("\n") + "\n" + line + "\n"


def set_batching(text: str, queue_delay_us: int, preferred: list[int]) -> str:
    fields = []
    if preferred:
        fields.append(f"preferred_batch_size: [ {', '.join(map(str, preferred))} ]")
    if queue_delay_us:
        fields.append(f"max_queue_delay_microseconds: {queue_delay_us}")
    block = "dynamic_batching { " + " ".join(fields) + (" }" if fields else "}")
    return re.sub(r"^dynamic_batching \{[^}]*\}", block, text, flags=re.M)


def assemble(args) -> Path:
    from facefuse.diffusion.manifest import MANIFEST_NAME, PipelineManifest
    from facefuse.models.tiny import NAMED_SHAPES, SD1_SCHEDULER, SD15

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    source = ROOT / "model_repository"
    overrides = {
        "runtime": args.runtime,
        "device": args.device,
        "dtype": args.dtype,
        "cuda_graphs": "true" if args.graphs else "false",
        "model_dir": args.model,
        "seed": str(args.seed),
    }
    for name in TORCH_MODELS:
        (out / name / "1").mkdir(parents=True)
        shutil.copy(source / name / "1" / "model.py", out / name / "1" / "model.py")
        text = (source / name / "configs" / CONFIG_NAME).read_text()
        for key, value in overrides.items():
            text = set_parameter(text, key, value)
        if name == "unet":
            text = set_batching(text, args.queue_delay_us, args.preferred)
            if args.unet_graph_batches:
                text = set_parameter(text, "graph_batch_sizes", args.unet_graph_batches)
        (out / name / "config.pbtxt").write_text(text)
    shape_name = args.model.split(":", 1)[1] if args.model.startswith("seeded:") else None
    shape = SD15 if shape_name == "sd15" else NAMED_SHAPES.get(shape_name or "", SD15)
    image = args.image or shape.sample_size * 8
    folder = out / "img2img" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(
        '"""img2img (generated): see facefuse.gpu.img2img_model."""\n\n'
        "from facefuse.gpu.img2img_model import TritonPythonModel  # noqa: F401\n"
    )
    (out / "img2img" / "config.pbtxt").write_text(IMG2IMG_CONFIG.format(instances=args.instances))
    PipelineManifest(
        model_id=args.model,
        image_size=image,
        vae_scale_factor=8,
        text_dim=shape.text_hidden,
        pad_token_id=49407,
        scheduler_config=SD1_SCHEDULER,
    ).save(folder / MANIFEST_NAME)
    print(f"assembled {out} ({', '.join([*TORCH_MODELS, 'img2img'])}; image {image} px)")
    return out


# ----------------------------------------------------------------------------- HTTP client
_DTYPES = {np.dtype(np.uint8): "UINT8", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64"}
_DTYPES[np.dtype(np.float32)] = "FP32"


def _encode(value) -> tuple[str, list[int], bytes]:
    if isinstance(value, bytes):
        return "BYTES", [1], struct.pack("<I", len(value)) + value
    array = np.ascontiguousarray(value)
    return _DTYPES[array.dtype], list(array.shape), array.tobytes()


def infer(conn: http.client.HTTPConnection, model: str, inputs: dict, outputs: list[str]):
    """One KServe v2 request with binary tensors; returns {name: array or bytes}."""
    header, blobs = {"inputs": [], "outputs": []}, []
    for name, value in inputs.items():
        datatype, shape, blob = _encode(value)
        header["inputs"].append(
            {
                "name": name,
                "shape": shape,
                "datatype": datatype,
                "parameters": {"binary_data_size": len(blob)},
            }
        )
        blobs.append(blob)
    header["outputs"] = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
    head = json.dumps(header).encode()
    conn.request(
        "POST",
        f"/v2/models/{model}/infer",
        body=head + b"".join(blobs),
        headers={
            "Inference-Header-Content-Length": str(len(head)),
            "Content-Type": "application/octet-stream",
        },
    )
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {body[:500].decode(errors='replace')}")
    size = int(response.getheader("Inference-Header-Content-Length") or len(body))
    meta, offset, result = json.loads(body[:size]), size, {}
    for out in meta["outputs"]:
        n = out["parameters"]["binary_data_size"]
        raw = body[offset : offset + n]
        offset += n
        if out["datatype"] == "BYTES":
            (length,) = struct.unpack("<I", raw[:4])
            result[out["name"]] = raw[4 : 4 + length]
        else:
            dtype = {v: k for k, v in _DTYPES.items()}[out["datatype"]]
            result[out["name"]] = np.frombuffer(raw, dtype=dtype).reshape(out["shape"])
    return result


def _get(url: str, path: str, timeout: float = 10.0) -> tuple[int, str]:
    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def _alive(pid: int | None) -> bool:
    if not pid:
        return True
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_ready(url: str, timeout_s: float, server_pid: int | None = None) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if not _alive(server_pid):
            raise RuntimeError(f"server process {server_pid} exited before it was ready")
        try:
            if _get(url, "/v2/health/ready", 2.0)[0] == 200:
                return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"server at {url} not ready after {timeout_s:.0f} s")


def _metric_sum(text: str, name: str, model: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _batch_stats(metrics_url: str | None) -> dict:
    if not metrics_url:
        return {}
    try:
        status, text = _get(metrics_url, "/metrics")
    except OSError as exc:
        return {"error": str(exc)}
    if status != 200:
        return {"error": f"HTTP {status}"}
    stats = {}
    for model in (*TORCH_MODELS, "img2img"):
        count = _metric_sum(text, "nv_inference_count", model)
        execs = _metric_sum(text, "nv_inference_exec_count", model)
        stats[model] = {"rows": count, "executions": execs}
    return stats


def _delta(after: dict, before: dict) -> dict:
    out = {}
    for model, now in after.items():
        if not isinstance(now, dict) or model not in before:
            continue
        rows = now["rows"] - before[model]["rows"]
        execs = now["executions"] - before[model]["executions"]
        out[model] = {"rows": rows, "executions": execs, "avg_batch": rows / execs if execs else 0}
    return out


def measure(args, report: dict, save=lambda: None) -> dict:
    """Fills ``report`` phase by phase and calls ``save`` after each (a hang keeps the rest)."""
    host, port = args.url.split(":")
    size = args.image
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)

    def request(conn, seed: int):
        inputs = {
            "IMAGE": image,
            "PROMPT": b"portrait photo of a person, smiling, detailed face",
            "STEPS": np.array([args.steps], dtype=np.int32),
            "STRENGTH": np.array([args.strength], dtype=np.float32),
            "SEED": np.array([seed], dtype=np.int64),
        }
        return infer(conn, "img2img", inputs, ["IMAGE", "INFO"])

    report.update(url=args.url, image=size, steps=args.steps, strength=args.strength)
    conn = http.client.HTTPConnection(host, int(port), timeout=args.request_timeout)
    t0 = time.perf_counter()
    first = request(conn, 0)
    report["first_request_s"] = round(time.perf_counter() - t0, 3)
    info = json.loads(first["INFO"])
    report["first_info"] = info
    report["output_shape"] = list(first["IMAGE"].shape)
    for _ in range(args.warmup):
        request(conn, 1)
    before = _batch_stats(args.metrics_url)
    single = []
    for i in range(args.single):
        t0 = time.perf_counter()
        request(conn, i)
        single.append(time.perf_counter() - t0)
    conn.close()
    report["single"] = _percentiles(single)
    report["single_unet_batches"] = _delta(_batch_stats(args.metrics_url), before)
    save()
    print(f"[served] one request: p50 {report['single']['p50_ms']:.1f} ms", flush=True)

    latencies: list[float] = []
    errors: list[str] = []
    stop = time.monotonic() + args.duration
    lock = threading.Lock()

    def client(k: int) -> None:
        c = http.client.HTTPConnection(host, int(port), timeout=args.request_timeout)
        i = 0
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                request(c, 1000 * k + i)
            except Exception as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])
                c.close()
                c = http.client.HTTPConnection(host, int(port), timeout=args.request_timeout)
                continue
            finally:
                i += 1
            with lock:
                latencies.append(time.perf_counter() - t0)
        c.close()

    before = _batch_stats(args.metrics_url)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    report["concurrent"] = {
        "clients": args.concurrency,
        "elapsed_s": round(elapsed, 2),
        "completed": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 3),
        "errors": len(errors),
        "first_errors": errors[:3],
        **_percentiles(latencies),
    }
    report["concurrent_batches"] = _delta(_batch_stats(args.metrics_url), before)
    print(
        f"[served] {args.concurrency} clients: {report['concurrent']['requests_per_s']:.2f} req/s,"
        f" p50 {report['concurrent'].get('p50_ms', 0):.1f} ms, {len(errors)} errors",
        flush=True,
    )
    return report


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ms = np.asarray(values) * 1000.0
    return {
        "n": len(values),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p90_ms": round(float(np.percentile(ms, 90)), 2),
        "min_ms": round(float(ms.min()), 2),
        "max_ms": round(float(ms.max()), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m facefuse.gpu.served")
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("assemble", help="write the torch-runtime repository")
    a.add_argument("--out", required=True)
    a.add_argument("--model", default="seeded:sd15", help="diffusers folder or seeded:<shape>")
    a.add_argument("--runtime", default="torch-cuda")
    a.add_argument("--device", default="cuda:0")
    a.add_argument("--dtype", default="float16")
    a.add_argument("--no-graphs", dest="graphs", action="store_false")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--image", type=int, default=0, help="pixels (0: the shape's native size)")
    a.add_argument("--instances", type=int, default=8, help="img2img pipelines in flight")
    a.add_argument("--queue-delay-us", type=int, default=0, help="unet max_queue_delay")
    a.add_argument(
        "--preferred",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[],
        help="unet preferred_batch_size list, e.g. 8,16",
    )
    a.add_argument("--unet-graph-batches", default="", help="unet graph_batch_sizes")
    m = sub.add_parser("measure", help="load the img2img model over HTTP")
    m.add_argument("--url", required=True, help="HOST:PORT of the HTTP endpoint")
    m.add_argument("--metrics-url", default=None, help="HOST:PORT of the metrics endpoint")
    m.add_argument("--image", type=int, default=512)
    m.add_argument("--steps", type=int, default=20)
    m.add_argument("--strength", type=float, default=0.5)
    m.add_argument("--warmup", type=int, default=2)
    m.add_argument("--single", type=int, default=10)
    m.add_argument("--concurrency", type=int, default=8)
    m.add_argument("--duration", type=float, default=30.0)
    m.add_argument("--request-timeout", type=float, default=120.0)
    m.add_argument("--wait-ready", type=float, default=0.0, help="wait this long for ready")
    m.add_argument("--json-out", default=None)
    m.add_argument("--server-pid", type=int, default=None, help="stop waiting if it exits")
    args = parser.parse_args(argv)
    if args.command == "assemble":
        assemble(args)
        return 0
    report: dict = {}

    def save() -> None:
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(report, indent=2))

    try:
        if args.wait_ready:
            ready = wait_ready(args.url, args.wait_ready, args.server_pid)
            report["ready_after_s"] = round(ready, 2)
            save()
        measure(args, report, save)
        code = 0
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        print(f"[served] error: {report['error']}", file=sys.stderr, flush=True)
        code = 1
    save()
    print(json.dumps(report, indent=2))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
