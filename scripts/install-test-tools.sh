#!/usr/bin/env bash
# Installs what the real-broker tests need, cached across runs:
# - nisshi 0.8.1, a Kafka-compatible broker (crates.io; a long first build),
#   into $MODSTREAM_CACHE_DIR/nisshi-0.8.1/bin/nisshi
# - kcat, a real Kafka client (Debian package)
# - prometheus and promtool (Debian package), to check and scrape /metrics
# - docker-compose (Debian package), only to validate docker-compose.yml
# - kubectl (Debian package kubernetes-client, if none is on the PATH), only
#   to render deploy/k8s with `kubectl kustomize`
# Fails with a clear message when either cannot be installed: the tests that
# need them are never skipped.
set -euo pipefail
cache=${MODSTREAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modstream}
nisshi="$cache/nisshi-0.8.1/bin/nisshi"
if [ ! -x "$nisshi" ]; then
  echo "install-test-tools: building the nisshi broker (first run only; takes a while)" >&2
  # nisshi 0.8.1 declares rust 1.96 but builds with 1.95.
  if ! cargo install nisshi --version 0.8.1 --locked --ignore-rust-version \
       --root "$cache/nisshi-0.8.1" >&2; then
    echo "install-test-tools: cannot build nisshi 0.8.1; the real-broker tests need it" >&2
    exit 1
  fi
fi
missing=""
command -v kcat >/dev/null || missing="$missing kcat"
command -v promtool >/dev/null || missing="$missing prometheus"
command -v docker-compose >/dev/null || missing="$missing docker-compose"
command -v kubectl >/dev/null || missing="$missing kubernetes-client"
if [ -n "$missing" ]; then
  echo "install-test-tools: installing$missing (Debian packages)" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing; } >&2; then
    echo "install-test-tools: cannot install$missing; the tests need them" >&2
    exit 1
  fi
fi
