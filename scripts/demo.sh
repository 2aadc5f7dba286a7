#!/usr/bin/env bash
# The demo command: installs the ONNX Runtime library into the cache, builds
# modstream (release) and runs `modstream demo` on an embedded Kafka cluster.
#   scripts/demo.sh [--events N] [--max-seconds S]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "demo: cargo not found; install a Rust toolchain (1.95+)" >&2; exit 1; }
ORT_DYLIB_PATH=$(scripts/fetch-onnxruntime.sh | tail -n 1)
export ORT_DYLIB_PATH
# -p: the workspace also holds the bench's binary.
cargo run --release --locked --quiet -p modstream --bin modstream -- demo "$@"
