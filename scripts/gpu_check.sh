#!/usr/bin/env bash
# The GPU check (issue 21) as ONE command, run from the repository root on the GPU host with
# `.device` carried (build it here first with scripts/gpu_pack.sh). Every stage is time-boxed;
# whatever finished is in $OUT:
#   env.txt                 python, torch, GPU, library versions, where libpython is
#   bench_gpu.json / .log   `facefuse bench gpu` (UNet rows/s per batch FP32/FP16 eager/graph,
#                           img2img diffusers FP16 eager vs facefuse FP16 + CUDA graphs)
#   served.json             one img2img request alone (p50) and N concurrent clients over HTTP,
#                           through tritonserver 2.51 with the torch-cuda repository
#   server.log, gpu_check.log
# Dry run on a CPU host: GPU_CHECK_DEVICE=cpu GPU_CHECK_SHAPE=tiny scripts/gpu_check.sh
# Knobs (environment): GPU_CHECK_PYTHON (python3), GPU_CHECK_BENCH_S (180), GPU_CHECK_READY_S
# (150), GPU_CHECK_DURATION (30), GPU_CHECK_CLIENTS (8), GPU_CHECK_SERVED (1; 0 skips),
# GPU_CHECK_BENCH (1; 0 skips), GPU_CHECK_QUEUE_US (0), GPU_CHECK_PREFERRED ("").
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
OUT=${OUT:-$REPO/out/gpu_check}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
DEVICE=${GPU_CHECK_DEVICE:-cuda}
SHAPE=${GPU_CHECK_SHAPE:-sd15}
PY=${GPU_CHECK_PYTHON:-python3}
PACK=${GPU_CHECK_PACK:-$REPO/.device}
WORK=${GPU_CHECK_WORK:-/tmp/facefuse_gpu_check}
CLIENTS=${GPU_CHECK_CLIENTS:-8}
DURATION=${GPU_CHECK_DURATION:-30}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - T0 ))s] $*"; }

if [ "$DEVICE" = cpu ]; then  # dry run: tiny shape, FP32 eager on the CPU, short load
  RUNTIME=torch-cpu; DTYPE=float32; TORCH_DEVICE=cpu; IMAGE=${GPU_CHECK_IMAGE:-128}
  LATENT=$((IMAGE / 8)); ITERS=${GPU_CHECK_ITERS:-2}; BATCHES=${GPU_CHECK_BATCHES:-1,2}
  INSTANCES=${GPU_CHECK_INSTANCES:-2}; CLIENTS=${GPU_CHECK_CLIENTS:-2}; SINGLE=3
  DURATION=${GPU_CHECK_DURATION:-10}; CONC=2
else
  RUNTIME=torch-cuda; DTYPE=float16; TORCH_DEVICE=cuda:0; IMAGE=${GPU_CHECK_IMAGE:-512}
  LATENT=$((IMAGE / 8)); ITERS=${GPU_CHECK_ITERS:-10}; BATCHES=${GPU_CHECK_BATCHES:-1,2,4,8,16}
  INSTANCES=${GPU_CHECK_INSTANCES:-8}; SINGLE=10; CONC=8
fi

# ---------------------------------------------------------------- 0. carried wheels, env
rm -rf "$WORK" && mkdir -p "$WORK"
stamp "installing carried wheels into $WORK/site"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
  "$PACK"/whl/*.whl || stamp "WARNING: wheel install failed"
export PYTHONPATH="$WORK/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"
{
  "$PY" - <<'EOF'
import importlib, sys, sysconfig, site
print("python", sys.version.split()[0], sys.executable)
print("base_prefix", sys.base_prefix, "LIBDIR", sysconfig.get_config_var("LIBDIR"),
      "LDLIBRARY", sysconfig.get_config_var("LDLIBRARY"))
print("site", site.getsitepackages())
for name in ("numpy", "torch", "diffusers", "transformers", "huggingface_hub", "scipy", "PIL"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "?"), m.__file__)
    except Exception as exc:
        print(name, "MISSING", exc)
import torch
print("cuda", torch.cuda.is_available(), torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
  nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv 2>&1 | head -3
  df -h /dev/shm 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# ---------------------------------------------------------------- 1. facefuse bench gpu
if [ "${GPU_CHECK_BENCH:-1}" = 1 ]; then
  stamp "bench gpu ($SHAPE on $DEVICE)"
  timeout -k 10 "${GPU_CHECK_BENCH_S:-180}" "$PY" -m facefuse.gpu.bench --device "$DEVICE" \
    --shape "$SHAPE" --latent "$LATENT" --iters "$ITERS" --batches "$BATCHES" \
    --concurrency "$CONC" --channels-last --json > "$OUT/bench_gpu.json" 2> "$OUT/bench_gpu.log"
  stamp "bench gpu exit $? ($(wc -c < "$OUT/bench_gpu.json") bytes of JSON)"
  tail -n 40 "$OUT/bench_gpu.log"
fi

# ---------------------------------------------------------------- 2. served through tritonserver
served() {
  local tree="$WORK/server" repo="$WORK/repo" venv="$WORK/stubvenv"
  mkdir -p "$tree"
  stamp "unpacking the trimmed server"
  tar -C "$tree" -xJf "$PACK/tritonserver.tar.xz" || return 1
  local pyver; pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  local tb="$tree/pytriton/tritonserver"
  cp "$tb/python_backend_stubs/$pyver/triton_python_backend_stub" "$tb/backends/python/" || {
    stamp "no Python-backend stub for $pyver in the carried tree"; return 1; }
  # The stub embeds libpython in ISOLATED mode: PYTHONPATH/PYTHONHOME are ignored; it finds
  # its prefix through the first python3 on PATH. So: a venv of the host's python, first on
  # the server's PATH, holding numpy 1.26 (cp312, from the pack; the dry run's 3.11 keeps the
  # numpy < 2 of its own site) and a .pth that appends the repository, the carried wheels and
  # the host python's own site-packages (torch, transformers..., numpy 2 shadowed) after it.
  env -u PYTHONPATH "$PY" -m venv --without-pip "$venv" || return 1
  local spv="$venv/lib/python$pyver/site-packages"
  if [ "$pyver" = 3.12 ]; then
    stamp "unpacking numpy 1.26 into the stub's venv"
    tar -C "$spv" -xJf "$PACK/stub-numpy-cp312.tar.xz" || return 1
  fi
  local info libdir base
  info=$(env -u PYTHONPATH "$PY" -c 'import sys, sysconfig, site; print(sys.base_prefix); print(sysconfig.get_config_var("LIBDIR") or ""); [print(p) for p in site.getsitepackages()]') || return 1
  base=$(echo "$info" | sed -n 1p); libdir=$(echo "$info" | sed -n 2p)
  {
    echo "$REPO"; echo "$WORK/site"
    echo "$info" | sed -n '3,$p' | while read -r d; do
      [ -n "$d" ] && echo "import site; site.addsitedir('$d')"
    done
  } > "$spv/zz_facefuse_stub.pth"
  cat "$spv/zz_facefuse_stub.pth"
  local lib="libpython$pyver.so.1.0" found=""
  for d in "$libdir" "$base/lib" /usr/lib/x86_64-linux-gnu /usr/local/lib /usr/lib; do
    if [ -n "$d" ] && [ -e "$d/$lib" ]; then found=$d; break; fi
  done
  if [ -z "$found" ]; then
    found=$(dirname "$(timeout 30 find / -xdev -name "$lib" 2>/dev/null | head -1)" 2>/dev/null)
  fi
  if [ -z "$found" ] || [ "$found" = . ]; then
    stamp "SKIP served: no $lib on this host (the stub links it)"; return 1
  fi
  stamp "stub: python $pyver, $lib in $found, venv $venv"
  (cd "$WORK" && PATH="$venv/bin:$PATH" timeout 120 "$venv/bin/python" -I -c 'import numpy, torch, transformers, diffusers, facefuse.gpu.runtime, facefuse.gpu.img2img_model; from diffusers import DPMSolverMultistepScheduler, UNet2DConditionModel; print("stub env: numpy", numpy.__version__, numpy.__file__, "torch", torch.__version__, "diffusers", diffusers.__version__, "cuda", torch.cuda.is_available())') || stamp "WARNING: the stub's environment does not import (the models will fail to load)"

  stamp "assembling the $RUNTIME repository ($SHAPE, $IMAGE px, $INSTANCES img2img instances)"
  "$PY" -m facefuse.gpu.served assemble --out "$repo" --model "seeded:$SHAPE" \
    --runtime "$RUNTIME" --device "$TORCH_DEVICE" --dtype "$DTYPE" --image "$IMAGE" \
    --instances "$INSTANCES" --queue-delay-us "${GPU_CHECK_QUEUE_US:-0}" \
    --preferred "${GPU_CHECK_PREFERRED:-}" || return 1

  local port=$((18000 + RANDOM % 1000))
  stamp "starting tritonserver on 127.0.0.1:$port"
  (cd "$WORK" && exec env -u PYTHONPATH PATH="$venv/bin:$PATH" \
    LD_LIBRARY_PATH="$found${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    timeout -k 10 $(( ${GPU_CHECK_READY_S:-150} + 2 * DURATION + 90 )) \
    "$tb/bin/tritonserver" --model-repository="$repo" --backend-directory="$tb/backends" \
    --http-address=127.0.0.1 --grpc-address=127.0.0.1 --metrics-address=127.0.0.1 \
    --http-port=$port --grpc-port=$((port + 1000)) --metrics-port=$((port + 2000)) \
    --pinned-memory-pool-byte-size=0 --cuda-memory-pool-byte-size=0:0 \
    --allow-gpu-metrics=false --backend-config=python,stub-timeout-seconds=600 \
    --log-verbose=0) > "$OUT/server.log" 2>&1 &
  local pid=$!
  # no PYTHONHOME/stub numpy for the client: it is a plain process of the host's python
  timeout -k 10 $(( ${GPU_CHECK_READY_S:-150} + 2 * DURATION + 60 )) "$PY" -m facefuse.gpu.served measure \
    --url "127.0.0.1:$port" --metrics-url "127.0.0.1:$((port + 2000))" \
    --wait-ready "${GPU_CHECK_READY_S:-150}" --image "$IMAGE" --single "$SINGLE" \
    --concurrency "$CLIENTS" --duration "$DURATION" --request-timeout 60 --json-out "$OUT/served.json" \
    --server-pid "$pid" > /dev/null
  stamp "measure exit $?"
  kill -INT "$pid" 2>/dev/null
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  grep -E "error|Error|WARNING|failed|graph" "$OUT/server.log" | head -n 40
  return 0
}
if [ "${GPU_CHECK_SERVED:-1}" = 1 ]; then
  served || stamp "served stage did not run to the end (see above and server.log)"
  [ -f "$OUT/served.json" ] && cat "$OUT/served.json"
fi
stamp "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
