#!/usr/bin/env bash
# Runs Apicurio Registry 3.3.3 (in-memory storage) on 127.0.0.1 in the
# foreground, from the archive scripts/fetch-apicurio.sh caches, with the
# Java 21+ it found. For `modstream bench --formats avro,protobuf
# --registry-url` and trying the Schema Registry formats without Docker.
#   scripts/apicurio-local.sh [PORT]     # default 8081; Ctrl-C stops it
# The Confluent-compatible API is http://127.0.0.1:PORT/apis/ccompat/v7.
# Prints "apicurio-local: ready at URL" once it answers.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-8081}
home=$(scripts/fetch-apicurio.sh | tail -n 1)
java=$(cat "$home/java")
cd "$home"
"$java" -Xmx512m -Dquarkus.http.port="$port" -Dquarkus.http.host=127.0.0.1 \
  -Dquarkus.management.port=$((port + 1)) -Dquarkus.management.host=127.0.0.1 \
  -jar quarkus-run.jar > /dev/null 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true' EXIT INT TERM
url="http://127.0.0.1:$port/apis/ccompat/v7"
for _ in $(seq 1 240); do
  if curl -sf "$url/subjects" > /dev/null 2>&1; then echo "apicurio-local: ready at $url"; wait "$pid"; exit; fi
  kill -0 "$pid" 2>/dev/null || { echo "apicurio-local: the registry exited" >&2; exit 1; }
  sleep 0.5
done
echo "apicurio-local: no answer within 120 s" >&2; exit 1
