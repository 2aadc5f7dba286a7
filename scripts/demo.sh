#!/usr/bin/env bash
# The demo command: installs the ONNX Runtime library into the cache, builds
# modstream (release) and runs `modstream demo` on an embedded Kafka cluster.
#   scripts/demo.sh [--events N] [--max-seconds S] [--rate R --seconds S]
# The build is the workspace's (`cargo build --release --locked`, as the
# README's own build), so that a later build or `modstream bench` reuses it.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "demo: cargo not found; install a Rust toolchain (1.95+)" >&2; exit 1; }
cache=${MODSTREAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modstream}
if [ ! -d "$cache/onnxruntime-1.31.1" ]; then
  echo "demo: fetching the ONNX Runtime library (a PyPI wheel, once, into $cache)" >&2
fi
ORT_DYLIB_PATH=$(scripts/fetch-onnxruntime.sh | tail -n 1)
export ORT_DYLIB_PATH
if [ ! -x target/release/modstream ]; then
  echo "demo: building modstream (release; the first build takes about 6 minutes on 2 cores, longer while cargo downloads its crates; later runs start at once)" >&2
fi
cargo build --release --locked
exec target/release/modstream demo "$@"
