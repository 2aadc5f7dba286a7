#!/usr/bin/env bash
# Installs what the real-broker tests need, cached across runs:
# - nisshi 0.8.1, a Kafka-compatible broker (crates.io; a long first build),
#   into $MODSTREAM_CACHE_DIR/nisshi-0.8.1/bin/nisshi
# - kcat, a real Kafka client (Debian package)
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
if ! command -v kcat >/dev/null; then
  echo "install-test-tools: installing kcat (Debian package)" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq kcat; } >&2; then
    echo "install-test-tools: cannot install kcat; the real-broker tests need it" >&2
    exit 1
  fi
fi
