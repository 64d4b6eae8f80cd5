"""Faults injected into real tritonservers, and what clients see while the service recovers.

- client cancellation stops the denoising loop at the next step (``request.is_cancelled``),
  on the shared server: the slot is free for the next request;
- a Python-backend stub killed (SIGKILL) in the middle of traffic, on a server of our own:
  tritonserver 2.51 does NOT restart the stub. The dead model answers every request with one
  line, ``Stub process '<model>_0_0' is not healthy.`` (HTTP 500), its callers (the BLS
  pipelines) answer 503 naming it with a retry hint, the other models keep serving, and
  ``/v2/health/ready`` keeps saying 200. Recovery: unload + load the model through the
  model-repository API with the admin key (the server must run with
  ``--model-control-mode=explicit``), which the supervisor of ``facefuse serve`` does by
  itself (tests/integration/test_self_healing.py), or restart the server;
- a corrupt and a missing ONNX file: the server does not start, the log names each file;
- the soak script (load_tests/soak.py) runs briefly against a real server.
"""

from __future__ import annotations

import csv
import io
import ipaddress
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import InferenceServerException

from facefuse.core.metrics import sample_total, scrape
from facefuse.serving.server import (
    ADMIN_HEADER,
    GRPC_ADMIN_HEADER,
    RESTRICTED_APIS,
    LocalTritonServer,
    ServerConfig,
    ServerError,
)
from tests.integration.polling import wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
STUB = "triton_python_backend_stub"


def fusion_inputs(module, source: bytes, target: bytes, steps: int, strength: float = 0.5):
    arrays = {
        "SOURCE_IMAGE": (np.array([source], dtype=object), "BYTES"),
        "TARGET_IMAGE": (np.array([target], dtype=object), "BYTES"),
        "INSTRUCTION": (np.array([b"make her smile"], dtype=object), "BYTES"),
        "STEPS": (np.array([steps], dtype=np.int32), "INT32"),
        "STRENGTH": (np.array([strength], dtype=np.float32), "FP32"),
    }
    inputs = []
    for name, (array, datatype) in arrays.items():
        item = module.InferInput(name, list(array.shape), datatype)
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def prompt_inputs():
    item = httpclient.InferInput("INSTRUCTION", [1], "BYTES")
    item.set_data_from_numpy(np.array([b"make her smile"], dtype=object))
    return [item]


def metric(metrics_url: str, name: str, **labels: str) -> float:
    return sample_total(scrape(metrics_url), name, **labels)


def stubs(server_pid: int) -> dict[int, str]:
    """pid -> model name of the Python-backend stubs under the server process."""
    found = {}
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            cmdline = child.cmdline()
        except psutil.Error:  # exited, or a zombie not yet reaped
            continue
        if cmdline and STUB in cmdline[0] and len(cmdline) > 1:
            found[child.pid] = Path(cmdline[1]).parts[-3]
    return found


def is_loopback(ip: str) -> bool:
    """127.0.0.1, ::1, or IPv4-mapped ::ffff:127.0.0.1 (gRPC listens on the latter)."""
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def log_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


# ---------------------------------------------------------------- cancellation


def test_cancelled_request_stops_its_denoising_loop(server, sample_images):
    source, target = sample_images
    labels = {"model": "facefusion", "outcome": "cancelled"}
    cancelled_before = metric(server.metrics_url, "facefuse_pipeline_requests_total", **labels)
    unet_before = metric(server.metrics_url, "nv_inference_count", model="unet")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        done = []
        # 100 steps at strength 1.0: 200 UNet rows if it ran to the end
        call = client.async_infer(
            "facefusion",
            fusion_inputs(grpcclient, source, target, steps=100, strength=1.0),
            callback=lambda result, error: done.append((result, error)),
        )
        wait_for(
            lambda: metric(server.metrics_url, "nv_inference_count", model="unet") > unet_before,
            120,
            "the request to reach its denoising loop",
        )
        call.cancel()
        wait_for(
            lambda: (
                metric(server.metrics_url, "facefuse_pipeline_requests_total", **labels)
                > cancelled_before
            ),
            120,
            "the pipeline to count the request as cancelled",
        )
        unet_rows = metric(server.metrics_url, "nv_inference_count", model="unet") - unet_before
        assert unet_rows < 100, f"the loop kept running after the cancel: {unet_rows} UNet rows"
        assert not any(result is not None for result, _ in done), "a cancelled call got a result"
        assert "request cancelled after" in log_text(server.log)
        # the slot is free: the next request is served
        response = client.infer("facefusion", fusion_inputs(grpcclient, source, target, steps=1))
        png = response.as_numpy("IMAGE").reshape(-1)[0]
        assert Image.open(io.BytesIO(png)).format == "PNG"
    finally:
        client.close()


# ---------------------------------------------------------------- soak script


def test_soak_script_runs_and_writes_csv_chart_and_summary(server, tmp_path):
    out = tmp_path / "reports"
    command = [
        sys.executable,
        str(ROOT / "load_tests" / "soak.py"),
        "--url",
        server.http_url,
        "--server-pid",
        str(server.process.pid),
        "--metrics-url",
        server.metrics_url,
        "--users",
        "2",
        "--duration",
        "20",
        "--warmup",
        "4",
        "--steps",
        "1",
        "--interval",
        "1",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "soak_summary.json").read_text())
    assert summary["requests_ok"] > 0 and summary["requests_failed"] == 0, summary
    assert isinstance(summary["rss_growth_after_warmup_pct"], float)
    assert summary["stub_processes"] >= 8  # one per Python model instance
    with open(out / "soak_rss.csv") as handle:
        rows = list(csv.DictReader(handle))
    processes = {row["process"] for row in rows}
    assert {"tritonserver", "unet", "facefusion", "text_encoder"} <= processes
    assert all(float(row["rss_mb"]) > 1 for row in rows)
    assert Image.open(out / "soak_rss.png").format == "PNG"
    assert "growth after warm-up" in done.stdout
    # loopback only
    refused = subprocess.run(
        [*command[:2], "--url", "10.1.2.3:8000", "--server-pid", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "loopback only" in refused.stderr


# ---------------------------------------------------------------- stub killed mid-traffic


@pytest.fixture(scope="module")
def own_server(tiny_repository, tmp_path_factory):
    """A server of our own (destroyed by the tests) in explicit model-control mode, so that a
    model can be reloaded through the (key-restricted) model-repository API."""
    repository = tmp_path_factory.mktemp("faults") / "model_repository"
    shutil.copytree(tiny_repository, repository, ignore=shutil.ignore_patterns("txt2img"))
    log = repository.parent / "tritonserver.log"
    config = ServerConfig(
        repository=repository,
        extra_args=["--model-control-mode=explicit", "--load-model=*"],
    )
    with LocalTritonServer(config, log_path=log) as running:
        running.log = log
        yield running


def admin(server, action: str, model: str, key: str | None) -> int:
    url = f"http://{server.http_url}/v2/repository/models/{model}/{action}"
    request = urllib.request.Request(url, data=b"{}", method="POST")
    if key is not None:
        request.add_header(ADMIN_HEADER, key)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_killed_stub_mid_traffic_fails_cleanly_and_recovers_by_reload(own_server, sample_images):
    server, (source, target) = own_server, sample_images
    victim = next(pid for pid, model in stubs(server.process.pid).items() if model == "unet")
    events: list[tuple[float, str, str, str]] = []  # (sent at, model, outcome, message)
    stop = threading.Event()
    started = time.monotonic()

    def traffic(model: str):
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
        try:
            while not stop.is_set():
                sent = time.monotonic() - started  # events are keyed by when a request began
                try:
                    if model == "facefusion":
                        client.infer(model, fusion_inputs(httpclient, source, target, steps=2))
                    else:
                        client.infer(model, prompt_inputs())
                    events.append((sent, model, "ok", ""))
                except InferenceServerException as exc:
                    events.append((sent, model, str(exc.status()), exc.message()))
                stop.wait(0.2)
        finally:
            client.close()

    threads = [threading.Thread(target=traffic, args=(m,)) for m in ("facefusion",) * 2]
    threads.append(threading.Thread(target=traffic, args=("prompt_optimizer",)))
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: any(e[1] == "facefusion" and e[2] == "ok" for e in events), 180, "ok")
        psutil.Process(victim).kill()
        cutoff = time.monotonic() - started + 1.0  # requests sent a second after the kill
        wait_for(
            lambda: (
                sum(e[0] > cutoff and e[1] == "facefusion" for e in events) >= 4
                and sum(e[0] > cutoff and e[1] == "prompt_optimizer" for e in events) >= 2
            ),
            180,
            "traffic after the kill",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=300)
    after = [e for e in events if e[0] > cutoff]
    fusion = [e for e in after if e[1] == "facefusion"]
    # the pipeline answers UNAVAILABLE (HTTP 503) with a retry hint (issue 33), not a 500
    assert fusion and all(e[2] == "503" for e in fusion), fusion
    for _, _, _, message in fusion:  # one line that names the dead stub, no traceback
        assert "model 'unet' is unavailable" in message, message
        assert "Stub process 'unet_0_0' is not healthy" in message, message
        assert "retry in a few seconds" in message, message
        assert "\n" not in message.strip() and "Traceback" not in message
    others = [e for e in after if e[1] == "prompt_optimizer"]
    assert others and all(e[2] == "ok" for e in others), others  # the rest keeps serving
    assert server.process.poll() is None, "tritonserver died with its stub"
    # Triton 2.51 neither restarts the stub nor marks the model unready
    assert "unet" not in stubs(server.process.pid).values()
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready") as response:
        assert response.status == 200
    # recovery: reload the model through the restricted API; without the key it is refused
    assert admin(server, "unload", "unet", key=None) == 403
    assert admin(server, "unload", "unet", key=server.config.admin_key) == 200
    assert admin(server, "load", "unet", key=server.config.admin_key) == 200
    new_pids = [pid for pid, model in stubs(server.process.pid).items() if model == "unet"]
    assert new_pids and victim not in new_pids
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    try:
        response = client.infer("facefusion", fusion_inputs(httpclient, source, target, steps=1))
    finally:
        client.close()
    png = response.as_numpy("IMAGE").reshape(-1)[0]
    assert Image.open(io.BytesIO(png)).format == "PNG"
    print(
        f"\nstub kill: {len(fusion)} facefusion requests failed after the kill, "
        f"{len(others)} prompt_optimizer requests served; reload restored unet"
    )


# ---------------------------------------------------------------- broken artefacts


def test_corrupt_or_missing_onnx_fails_start_with_a_log_line_naming_the_file(
    tiny_repository, tmp_path
):
    from facefuse.bench.e2e import served_parameters

    repository = tmp_path / "model_repository"
    for model in ("unet", "vae_decoder"):
        shutil.copytree(tiny_repository / model, repository / model)
    # the file the CPU config serves here (runtime auto: model.onnx on OpenVINO for a large graph)
    served = served_parameters(repository, "unet")
    corrupt = repository / "unet" / "1" / served["onnx_file"]
    corrupt.write_bytes(b"\x08\x07this is not a protobuf" + corrupt.read_bytes()[:1000])
    missing = repository / "vae_decoder" / "1" / "model.onnx"
    missing.unlink()
    log = tmp_path / "tritonserver.log"
    config = ServerConfig(repository=repository, ready_timeout_s=240)
    with pytest.raises(ServerError, match="exited with code"):
        LocalTritonServer(config, log_path=log).start()
    text = log_text(log)
    refusal = {"openvino": "OpenVINO cannot compile it", "onnxruntime": "not a loadable ONNX model"}
    expected = f"{corrupt.resolve()}: {refusal[served['runtime']]}"
    assert expected in text, text[-3000:]
    assert f"{missing.resolve()}: ONNX file not found" in text, text[-3000:]
    assert re.search(r"failed to load 'unet'", text) and re.search(
        r"failed to load 'vae_decoder'", text
    )


@pytest.mark.parametrize(
    ("model", "key", "value", "expected"),
    [
        ("facefusion", "upper_face_pixels", "latent",
         "pipeline parameter upper_face_pixels must be one of ('decoded', 'source')"),
        ("facefusion", "upper_face_split", "1.5",
         "pipeline parameter upper_face_split must be in [-1, 1], got 1.5"),
        ("facefusion", "default_strength", "2",
         "pipeline parameter default_strength must be in [0.05, 1.0], got 2.0"),
        ("facefusion", "inversion", "yes",
         "pipeline parameter inversion must be true or false, got 'yes'"),
        ("facefusion", "scheduler", "dpm++",  # the shipped config inverts
         "inversion needs the ddim scheduler, got 'dpm++'"),
        ("unet", "openvino_min_mb", "big",
         "unet: parameter openvino_min_mb must be a number of megabytes, got 'big'"),
    ],
)  # fmt: skip
def test_bad_model_parameter_fails_the_load_with_a_line_naming_it(
    tiny_repository, tmp_path, model, key, value, expected
):
    """A config.pbtxt with a malformed parameter does not load, and the server log names the
    parameter and what it takes."""
    from facefuse.export import configs

    repository = tmp_path / "model_repository"
    shutil.copytree(tiny_repository / model, repository / model)
    path = repository / model / "config.pbtxt"
    config = configs.read(path)
    configs.set_parameter(config, key, value)
    configs.write(config, path, generated_by="test_faults")
    log = tmp_path / "tritonserver.log"
    config = ServerConfig(repository=repository, ready_timeout_s=240)
    with pytest.raises(ServerError, match="exited with code"):
        LocalTritonServer(config, log_path=log).start()
    text = log_text(log)
    assert expected in text, text[-3000:]
    assert f"failed to load '{model}'" in text, text[-3000:]


# ---------------------------------------------------------------- facefuse serve: access


def test_serve_is_loopback_only_and_restricts_admin_apis_by_default(tiny_repository, tmp_path):
    """`facefuse serve` as a user runs it (one light model): the model-repository,
    shared-memory, logging and trace APIs refuse callers without the admin key (HTTP; the
    model-repository API over gRPC too) and accept it, and every listening socket of
    tritonserver is bound to 127.0.0.1."""
    repository = tmp_path / "model_repository"
    shutil.copytree(tiny_repository / "prompt_optimizer", repository / "prompt_optimizer")
    key = "k" * 32
    command = [sys.executable, "-m", "facefuse.cli", "serve", "--repository", str(repository)]
    command += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--admin-key", key]
    serve = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(serve.stdout), daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: serve.poll() is not None or any(x.startswith("ready:") for x in lines),
            300,
            "facefuse serve to print its endpoints",
        )
        ready = next((x for x in lines if x.startswith("ready:")), "")
        match = re.search(r"HTTP 127\.0\.0\.1:(\d+)\s+gRPC 127\.0\.0\.1:(\d+)", ready)
        assert match, lines
        http, grpc_port = (f"127.0.0.1:{p}" for p in match.groups())
        index = f"http://{http}/v2/repository/index"

        def post(url: str, headers: dict) -> int:
            request = urllib.request.Request(url, data=b"{}", method="POST", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status
            except urllib.error.HTTPError as exc:
                return exc.code

        def get(url: str, headers: dict) -> int:
            request = urllib.request.Request(url, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status
            except urllib.error.HTTPError as exc:
                return exc.code

        # each restricted API: refused without the key or with a wrong one, accepted with it
        restricted = {
            "model-repository": (post, f"http://{http}/v2/repository/index"),
            "shared-memory": (get, f"http://{http}/v2/systemsharedmemory/status"),
            "logging": (post, f"http://{http}/v2/logging"),
            "trace": (get, f"http://{http}/v2/trace/setting"),
        }
        assert set(restricted) == set(RESTRICTED_APIS)
        for api, (call, url) in restricted.items():
            assert call(url, {}) == 403, api
            assert call(url, {ADMIN_HEADER: "wrong"}) == 403, api
            assert call(url, {ADMIN_HEADER: key}) == 200, api
        client = grpcclient.InferenceServerClient(grpc_port)
        try:
            with pytest.raises(InferenceServerException) as denied:
                client.get_model_repository_index()
            assert "restricted" in str(denied.value.message())  # 2.51 says UNAVAILABLE
            # over gRPC, Triton expects the key under a prefixed header name
            with pytest.raises(InferenceServerException):
                client.get_model_repository_index(headers={ADMIN_HEADER: key})
            index = client.get_model_repository_index(headers={GRPC_ADMIN_HEADER: key})
            assert index is not None
            assert client.is_server_live()  # inference and health stay open
        finally:
            client.close()
        triton = next(
            p
            for p in psutil.Process(serve.pid).children(recursive=True)
            if p.name() == "tritonserver"
        )
        listening = [
            c.laddr for c in triton.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
        ]
        assert len(listening) >= 3 and all(is_loopback(a.ip) for a in listening), listening
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
