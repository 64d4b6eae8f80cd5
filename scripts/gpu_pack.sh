#!/usr/bin/env bash
# Build .device/ (git-ignored): what `scripts/gpu_check.sh` needs on the GPU host and is not
# there. Run from the repository root after `make install` (reads .venv's nvidia-pytriton):
#   .device/whl/                    diffusers + importlib_metadata wheels (pure Python),
#                                   tritonclient + protobuf + grpcio (the model config protobuf)
#   .device/stub-numpy-cp312.tar.xz numpy 1.26.4 for CPython 3.12, tests stripped: the
#                                   tritonserver 2.51 Python-backend stub breaks with numpy 2
#   .device/tritonserver.tar.xz     tritonserver + Python backend + stubs 3.11/3.12 + the shared
#                                   libraries they load (libpython 3.13 dropped, binaries
#                                   stripped, ICU data replaced by scripts/gpu_icudata_stub.c)
# Prints the sizes: the device run carries the working tree plus `.device`, 64 MiB in all.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DEST=.device
SP=$($PY -c 'import site; print(site.getsitepackages()[0])')
DIFFUSERS=$($PY -c 'import diffusers; print(diffusers.__version__)')
rm -rf "$DEST" && mkdir -p "$DEST/whl"
TMP=$(mktemp -d) && trap 'rm -rf "$TMP"' EXIT
quiet() { grep -v '^WARNING: Location' || true; }

# 1. pure-Python wheels missing on the GPU host (importlib_metadata 8.x: no lazy-importer need)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$DEST/whl" \
  "diffusers==$DIFFUSERS" "importlib_metadata==8.7.0" 2>&1 | quiet

# 1b. the protobuf model config that `facefuse.gpu.served` edits configs with (tritonclient's
# model_config_pb2 imports grpc): the .venv's versions, built for CPython 3.12
pins=$($PY -c 'from importlib.metadata import version as v; print(" ".join(f"{p}=={v(p)}" for p in ("tritonclient", "protobuf", "grpcio")))')
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST/whl" $pins 2>&1 | quiet

# 2. numpy 1.26.4 for the stub's CPython 3.12, unpacked, tests and type stubs removed
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --target "$TMP/stubsite" numpy==1.26.4 2>&1 | quiet
find "$TMP/stubsite" -depth \( -name tests -o -name '*.pyi' -o -name __pycache__ \) -exec rm -rf {} +
rm -rf "$TMP/stubsite/numpy/f2py" "$TMP/stubsite/numpy/distutils" "$TMP/stubsite/bin"
tar -C "$TMP/stubsite" -cf - . | xz -9 -T2 > "$DEST/stub-numpy-cp312.tar.xz"

# 3. the trimmed server tree (same layout as site-packages: the RPATHs stay valid)
T="$TMP/server"
mkdir -p "$T/pytriton/tritonserver/bin" "$T/pytriton/tritonserver/backends/python" \
  "$T/pytriton/tritonserver/python_backend_stubs" "$T/nvidia_pytriton.libs"
cp "$SP/pytriton/tritonserver/bin/tritonserver" "$T/pytriton/tritonserver/bin/"
cp "$SP/pytriton/tritonserver/backends/python/libtriton_python.so" \
  "$SP/pytriton/tritonserver/backends/python/triton_python_backend_utils.py" \
  "$T/pytriton/tritonserver/backends/python/"
for v in 3.11 3.12; do
  cp -r "$SP/pytriton/tritonserver/python_backend_stubs/$v" "$T/pytriton/tritonserver/python_backend_stubs/"
done
cp "$SP"/nvidia_pytriton.libs/*.so* "$T/nvidia_pytriton.libs/"
rm -f "$T"/nvidia_pytriton.libs/libpython3-*   # a 3.13 libpython nothing here loads
strip --strip-unneeded "$T/pytriton/tritonserver/bin/tritonserver" \
  "$T"/nvidia_pytriton.libs/libtritonserver-*.so
ICU=$(cd "$T/nvidia_pytriton.libs" && ls libicudata-*.so*)
cc -shared -fPIC -O2 -Wl,-soname,"$ICU" -o "$T/nvidia_pytriton.libs/$ICU" scripts/gpu_icudata_stub.c
tar -C "$T" -cf - . | xz -9 -T2 > "$DEST/tritonserver.tar.xz"

du -b "$DEST"/whl/* "$DEST"/*.tar.xz
echo "total carried by .device: $(du -sb "$DEST" | cut -f1) bytes ($(du -sh "$DEST" | cut -f1))"
