"""Run NVIDIA perf_analyzer against ``facefusion`` and each composing model (loopback only).

The binary comes from the ``tritonclient==2.51.0`` wheel (the PyPI ``perf-analyzer`` package is
an empty placeholder); it is unpacked, not installed, into ``.cache/perf_analyzer`` together with
symlinks to the ``libb64`` and ``libcudart`` copies that ship in ``nvidia-pytriton``. Input data
files are written from the photos that ship in installed wheels.

    python load_tests/perf_analyzer.py --url 127.0.0.1:8001 --concurrency 1:4
    python load_tests/perf_analyzer.py --start-server model_repository   # own server, stopped after

Each run is bounded (``--measurement-interval``, ``--max-trials``, a wall-clock timeout).
"""

from __future__ import annotations

import argparse
import base64
import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

CACHE = Path(".cache/perf_analyzer")
WHEEL_VERSION = "2.51.0"
# model -> (batch size sent with -b, needs an input-data file)
MODELS = {
    "facefusion": 0,
    "face_analyzer": 0,
    "prompt_optimizer": 0,
    "text_encoder": 2,
    "vae_encoder": 1,
    "unet": 2,
    "vae_decoder": 1,
}


def ensure_binary(cache: Path = CACHE) -> tuple[Path, Path]:
    """(perf_analyzer binary, library dir) unpacked from the tritonclient 2.51.0 wheel."""
    binary, libs = cache / "perf_analyzer", cache / "lib"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "-d",
                str(cache),
                f"tritonclient=={WHEEL_VERSION}",
            ],
            check=True,
        )
        wheel = next(cache.glob(f"tritonclient-{WHEEL_VERSION}-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            member = f"tritonclient-{WHEEL_VERSION}.data/data/bin/perf_analyzer"
            binary.write_bytes(archive.read(member))
        binary.chmod(0o755)
    if not libs.exists():
        import pytriton

        shipped = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
        libs.mkdir(parents=True)
        for prefix, name in (("libb64-", "libb64.so.0d"), ("libcudart-", "libcudart.so.12")):
            (libs / name).symlink_to(next(shipped.glob(prefix + "*")))
    return binary, libs


def _bytes(data: bytes) -> dict:
    """A BYTES element as perf_analyzer reads b64 data: Triton's serialisation, a 4-byte
    little-endian length before the bytes."""
    return {"b64": base64.b64encode(struct.pack("<I", len(data)) + data).decode()}


def _json_tensor(array: np.ndarray) -> dict:
    """One tensor of a perf_analyzer input-data document."""
    if array.dtype == object:
        return _bytes(bytes(array.reshape(-1)[0]))
    return {"content": array.reshape(-1).tolist(), "shape": list(array.shape)}


def _document(arrays: dict[str, np.ndarray]) -> dict:
    return {name: _json_tensor(array) for name, array in arrays.items()}


def input_data(model: str, manifest: dict) -> dict:
    """One perf_analyzer input-data document for ``model``, its names from the contract."""
    from facefuse.core import contract as c
    from facefuse.core.samples import sample_pair

    source, target = sample_pair()
    rng = np.random.default_rng(0)
    size, latent, dim = (
        manifest["image_size"],
        manifest["image_size"] // manifest["vae_scale_factor"],
        manifest["text_dim"],
    )
    channels = manifest.get("latent_channels", 4)
    instruction = "make her smile, keep the glasses, soft studio light"
    rows = {
        "facefusion": c.facefusion_request(source, target, instruction, steps=4),
        "face_analyzer": {
            c.SOURCE_IMAGE.name: c.SOURCE_IMAGE.scalar(source),
            c.TARGET_IMAGE.name: c.TARGET_IMAGE.scalar(target),
            c.SIZE.name: c.SIZE.scalar(size),
        },
        "prompt_optimizer": {c.INSTRUCTION.name: c.INSTRUCTION.scalar(instruction)},
        "text_encoder": {
            c.INPUT_IDS.name: np.array([49406, 320, 1125, 49407] + [49407] * 73, dtype=np.int64)
        },
        "vae_encoder": {c.PIXELS.name: rng.uniform(-1, 1, (3, size, size)).astype(np.float32)},
        "unet": {
            c.SAMPLE.name: rng.standard_normal((channels, latent, latent)).astype(np.float32),
            c.TIMESTEP.name: np.array([500.0], dtype=np.float32),
            c.ENCODER_HIDDEN_STATES.name: rng.standard_normal((77, dim)).astype(np.float32),
        },
        "vae_decoder": {
            c.LATENT.name: rng.standard_normal((channels, latent, latent)).astype(np.float32)
        },
    }
    return {"data": [_document(rows[model])]}


def run_model(
    binary: Path, libs: Path, model: str, url: str, args, out: Path, manifest: dict
) -> Path:
    import os

    data_file = out / f"{model}-input.json"
    data_file.write_text(json.dumps(input_data(model, manifest)))
    csv = out / f"{model}.csv"
    command = [
        str(binary),
        "-m",
        model,
        "-u",
        url,
        "-i",
        "grpc",
        "--input-data",
        str(data_file),
        "--concurrency-range",
        args.concurrency,
        "--measurement-interval",
        str(args.measurement_ms),
        "--stability-percentage",
        "25",
        "--max-trials",
        "3",
        "-f",
        str(csv),
    ]
    if MODELS[model]:
        command += ["-b", str(MODELS[model])]
    env = dict(os.environ, LD_LIBRARY_PATH=str(libs))
    print("$", " ".join(command[:12]), "...", flush=True)
    completed = subprocess.run(
        command, env=env, timeout=args.timeout, capture_output=True, text=True
    )
    (out / f"{model}.log").write_text(completed.stdout + completed.stderr)
    summary = [line for line in completed.stdout.splitlines() if "Concurrency:" in line]
    print("\n".join(summary) or completed.stdout[-2000:] + completed.stderr[-2000:], flush=True)
    if completed.returncode != 0:
        raise SystemExit(
            f"perf_analyzer failed for {model} (exit {completed.returncode}); "
            f"see {out / f'{model}.log'}"
        )
    return csv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url", default="127.0.0.1:8001", help="gRPC address of a running server (loopback)"
    )
    parser.add_argument(
        "--start-server",
        type=Path,
        default=None,
        metavar="REPOSITORY",
        help="start a local server on this exported repository instead of using --url",
    )
    parser.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated models to profile"
    )
    parser.add_argument(
        "--concurrency", default="1:4", help="perf_analyzer --concurrency-range (default 1:4)"
    )
    parser.add_argument(
        "--measurement-ms", type=int, default=8000, help="measurement window per trial (ms)"
    )
    parser.add_argument(
        "--stability",
        type=int,
        default=50,
        help="perf_analyzer --stability-percentage (default 50: a shared 2-core machine is noisy)",
    )
    parser.add_argument("--timeout", type=int, default=600, help="wall-clock limit per model (s)")
    parser.add_argument(
        "--out", type=Path, default=Path("reports/perf_analyzer"), help="CSV and logs go here"
    )
    args = parser.parse_args(argv)
    host = args.url.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "[::1]"):
        parser.error(f"--url {args.url}: loopback only")
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(MODELS)
    if unknown:
        parser.error(f"--models: unknown {sorted(unknown)}; expected some of {list(MODELS)}")
    binary, libs = ensure_binary()
    args.out.mkdir(parents=True, exist_ok=True)

    def profile(url: str, repository: Path) -> None:
        manifest = json.loads((repository / "facefusion" / "1" / "pipeline.json").read_text())
        for model in models:
            run_model(binary, libs, model, url, args, args.out, manifest)

    if args.start_server:
        from facefuse.serving.server import LocalTritonServer, ServerConfig

        config = ServerConfig(repository=args.start_server)
        with LocalTritonServer(config, log_path=args.out / "tritonserver.log") as server:
            profile(server.grpc_url, args.start_server)
    else:
        profile(args.url, Path("model_repository"))
    print(f"CSV files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
