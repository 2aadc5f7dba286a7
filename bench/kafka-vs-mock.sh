#!/usr/bin/env bash
# The same bench twice in a row, once on the embedded mock cluster and once
# on Apache Kafka 4.4 (one KRaft node from scripts/kafka-local.sh on a free
# port), each with the broker's own produce -> consume floor at the same
# loads. Writes OUT/mock/bench.json and OUT/kafka/bench.json (+ charts).
#   bench/kafka-vs-mock.sh [OUT]        # default target/bench-kafka
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/bench-kafka}
export ORT_DYLIB_PATH=${ORT_DYLIB_PATH:-$(scripts/fetch-onnxruntime.sh | tail -n 1)}
cargo build --release --locked
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log=$(mktemp)
scripts/kafka-local.sh "$port" > "$log" 2>&1 &
kafka=$!
trap 'kill $kafka 2>/dev/null || true; wait 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 300); do grep -q "ready at" "$log" && break; sleep 0.2; done
grep -q "ready at" "$log" || { cat "$log" >&2; exit 1; }
opts=(--events 20000 --batch-sizes 1,32,128 --delays-ms 5 --loads 0.25,0.5,0.75
      --latency-seconds 5 --workers 2 --target-p99-ms 50 --step-seconds 0
      --repeat-shares --overload 0)
target/release/modstream bench "${opts[@]}" --out "$out/mock"
target/release/modstream bench "${opts[@]}" --bootstrap "127.0.0.1:$port" --out "$out/kafka"
echo "wrote $out/mock/bench.json and $out/kafka/bench.json"
