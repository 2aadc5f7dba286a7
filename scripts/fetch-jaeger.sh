#!/usr/bin/env bash
# Builds Jaeger v1.75.0's `jaeger` program (the trace backend of
# tests/traces.rs: an OTLP receiver and a query API) from its Go module,
# pinned by tests/jaeger/go.mod and go.sum, through the Go module proxy.
# The Go module and build caches live in the modstream cache too. Reruns
# are instant. Prints the program's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${MODSTREAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modstream}
dest="$cache/jaeger-1.75.0"
stamp="$dest/.mod-$(cat tests/jaeger/go.mod tests/jaeger/go.sum | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ -x "$dest/jaeger" ]; then echo "$dest/jaeger"; exit 0; fi
command -v go >/dev/null || { echo "fetch-jaeger: go not found; install Go 1.26+ (the trace tests build Jaeger from its module)" >&2; exit 1; }
echo "fetch-jaeger: building Jaeger v1.75.0 from the Go module proxy (first run only, a few minutes)" >&2
rm -rf "$dest.partial"; mkdir -p "$dest.partial"
export GOMODCACHE="$cache/go-mod" GOCACHE="$cache/go-build" GOFLAGS=-mod=mod
if ! (cd tests/jaeger && go build -o "$dest.partial/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger) >&2; then
  echo "fetch-jaeger: could not build github.com/jaegertracing/jaeger/cmd/jaeger@v1.75.0 (see above); the trace tests need it" >&2
  exit 1
fi
rm -rf "$dest"; mv "$dest.partial" "$dest"
touch "$stamp"
echo "$dest/jaeger"
