#!/usr/bin/env bash
# The soak (tests/soak.rs, ignored in the test command): Apache Kafka, a
# paced load at 70 % of the service's own saturation, a model hot reload
# every minute, a member joining and leaving every 5 minutes, a policy
# change every 10; samples every minute. Writes docs/reliability/soak.json
# and soak.svg, then renders docs/reliability.md again.
#   scripts/soak.sh [--minutes M]     (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=30
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    *) echo "soak: unknown argument $1 (use --minutes M)" >&2; exit 2 ;;
  esac
done
ORT_DYLIB_PATH=$(scripts/fetch-onnxruntime.sh | tail -n 1)
KAFKA_LIBS=$(scripts/fetch-kafka.sh | tail -n 1)
export ORT_DYLIB_PATH KAFKA_LIBS
mkdir -p docs/reliability
MODSTREAM_SOAK_MINUTES=$minutes MODSTREAM_SOAK_OUT=docs/reliability \
  cargo test --release --locked --test soak -- --ignored --exact the_soak_scripts_soak_sh_asks_for --nocapture
scripts/reliability-table.sh
