#!/usr/bin/env bash
# The test command: installs what the tests need (ONNX Runtime library, Apache
# Kafka's jars, Apicurio Registry, Jaeger, the test tools, the Python venvs, the MiniLM model; all cached),
# checks formatting and lints, then runs the whole suite. Every set-up step is
# here, before `cargo test`: no test installs anything (tests run in parallel).
# Reruns reuse the cache and the build.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "test: cargo not found; install a Rust toolchain (1.95+)" >&2; exit 1; }
# CI builds once from a clean clone: incremental state would only take disk.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
echo "test: free disk where target/ goes: $(df -h --output=avail . | tail -n 1 | tr -d ' ')"
ORT_DYLIB_PATH=$(scripts/fetch-onnxruntime.sh | tail -n 1)
export ORT_DYLIB_PATH
KAFKA_LIBS=$(scripts/fetch-kafka.sh | tail -n 1)
export KAFKA_LIBS
MODSTREAM_APICURIO=$(scripts/fetch-apicurio.sh | tail -n 1)
export MODSTREAM_APICURIO
MODSTREAM_JAEGER=$(scripts/fetch-jaeger.sh | tail -n 1)
export MODSTREAM_JAEGER
scripts/install-test-tools.sh
MODSTREAM_K8S_PYTHON=$(scripts/k8s-validate-venv.sh | tail -n 1)
MODSTREAM_BASELINE_PYTHON=$(bench/python-baseline.sh | tail -n 1)
MODSTREAM_REGISTRY_PYTHON=$(scripts/registry-venv.sh | tail -n 1)
export MODSTREAM_K8S_PYTHON MODSTREAM_BASELINE_PYTHON MODSTREAM_REGISTRY_PYTHON
scripts/build-minilm-model.sh >/dev/null
cargo fmt --all -- --check || { echo "test: cargo fmt --check failed; run cargo fmt" >&2; exit 1; }
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked "$@"
