#!/usr/bin/env bash
# Installs the test tools from Debian's packages (skipped when present):
# - kcat, a real Kafka client
# - prometheus and promtool, to check and scrape /metrics
# - docker-compose, only to validate docker-compose.yml
# - kubectl (kubernetes-client, if none is on the PATH), only to render
#   deploy/k8s with `kubectl kustomize`
# - openssl, to make the TLS certificates of the secured-broker tests
# - curl, as the README's tour uses it (tests/tour.rs runs the tour)
# Fails with a clear message when one cannot be installed: the tests that
# need them are never skipped. (Apache Kafka: scripts/fetch-kafka.sh.)
set -euo pipefail
missing=""
command -v kcat >/dev/null || missing="$missing kcat"
command -v promtool >/dev/null || missing="$missing prometheus"
command -v docker-compose >/dev/null || missing="$missing docker-compose"
command -v kubectl >/dev/null || missing="$missing kubernetes-client"
command -v openssl >/dev/null || missing="$missing openssl"
command -v curl >/dev/null || missing="$missing curl"
if [ -n "$missing" ]; then
  echo "install-test-tools: installing$missing (Debian packages)" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing; } >&2; then
    echo "install-test-tools: cannot install$missing; the tests need them" >&2
    exit 1
  fi
fi
