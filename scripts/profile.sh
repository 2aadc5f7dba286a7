#!/usr/bin/env bash
# Where modstream's CPU goes under load: `perf record` of one process, then
# the top entries by thread, by thread and library, and by thread and symbol.
#   scripts/profile.sh [--events N] [--out DIR]
#       `modstream demo --events N` (embedded cluster in the same process;
#       its threads are the rdk:* and mock ones) from start to end.
#   scripts/profile.sh --bootstrap HOST:PORT [--events N] [--seconds S] [--out DIR]
#       N events produced to fresh topics on that cluster first, then
#       `modstream run` (the shipped defaults) recorded for S seconds.
#   --call-graph  record call stacks too (DWARF, 499 Hz: keep --seconds
#       short) and add the main thread's functions with their callees'
#       time (where its time goes, by stage).
#   --model DIR   the model `modstream run` loads (e.g. models/null-text,
#       from scripts/build-null-models.sh: the service's own cost alone).
#   --partitions N  partitions of each topic it creates (default 4).
#   --config-extra FILE  appended to the configuration (e.g. a [matching]
#       section with a list).
#   --settle S  seconds between starting `modstream run` and recording
#       (default 5: the model loaded and the group joined; longer for a
#       large list).
# Writes DIR/perf.data and DIR/profile.txt (default target/profile).
# Needs perf (linux-perf) and kernel.perf_event_paranoid <= 2 for a process
# of one's own.
set -euo pipefail
cd "$(dirname "$0")/.."
events=100000
seconds=15
out=target/profile
bootstrap=
model=
graph=()
extra=
settle=5
while [ $# -gt 0 ]; do
  case "$1" in
    --events) events=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --bootstrap) bootstrap=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --partitions) partitions=$2; shift 2 ;;
    --config-extra) extra=$2; shift 2 ;;
    --settle) settle=$2; shift 2 ;;
    --call-graph) graph=(--call-graph dwarf,16384); shift ;;
    *) echo "profile: unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v perf >/dev/null || { echo "profile: perf not found (apt-get install linux-perf)" >&2; exit 1; }
ORT_DYLIB_PATH=$(scripts/fetch-onnxruntime.sh | tail -n 1)
export ORT_DYLIB_PATH
cargo build --release --locked --quiet
bin=${CARGO_TARGET_DIR:-target}/release/modstream
mkdir -p "$out"
data="$out/perf.data"

if [ -z "$bootstrap" ]; then
  perf record -F 999 -o "$data" -- "$bin" demo --events "$events" --max-seconds 600 >/dev/null
else
  run="profile-$(date +%s)"
  cat > "$out/modstream.toml" <<EOF
[kafka]
bootstrap_servers = "$bootstrap"
group_id = "$run"
[input]
topics = ["$run-events"]
[output]
topic = "$run-verdicts"
dlq_topic = "$run-dlq"
[telemetry]
listen = "127.0.0.1:0"
log_level = "warn"
EOF
  if [ -n "$model" ]; then
    printf '[inference]\nmodel_dir = "%s"\n' "$(realpath "$model")" >> "$out/modstream.toml"
  fi
  if [ -n "$extra" ]; then
    cat "$extra" >> "$out/modstream.toml"
  fi
  # Four partitions each unless told (clusters like the tests' do not create
  # topics on use).
  libs=$(scripts/fetch-kafka.sh | tail -n 1)
  for t in events verdicts dlq; do
    java -Xmx256m -XX:+UseSerialGC -cp "$libs/*" org.apache.kafka.tools.TopicCommand \
      --bootstrap-server "$bootstrap" --create --topic "$run-$t" --partitions "${partitions:-4}" >/dev/null
  done
  "$bin" produce --bootstrap "$bootstrap" --topic "$run-events" --count "$events" >/dev/null
  "$bin" run --config "$out/modstream.toml" >/dev/null &
  pid=$!
  trap 'kill -TERM $pid 2>/dev/null || true' EXIT
  # The model loaded and the group joined before recording starts.
  sleep "$settle"
  freq=999
  [ ${#graph[@]} -eq 0 ] || freq=499
  perf record -F "$freq" "${graph[@]}" -p "$pid" -o "$data" -- sleep "$seconds"
  kill -TERM "$pid"
  wait "$pid" || true
  trap - EXIT
fi

report() {
  perf report -i "$data" --no-children -g none --stdio --percent-limit "${limit:-0.5}" "$@" 2>/dev/null \
    | grep -v '^#' | sed -e '/^$/d' -e 's/[ -]*$//'
}
# `head` ends each report early: no pipefail for them.
set +o pipefail
{
  echo "## by thread"; report --sort comm | head -20
  echo; echo "## by thread and library"; report --sort comm,dso | head -30
  echo; echo "## by thread and symbol (top 40)"; report --sort comm,dso,symbol | head -40
  echo; echo "## modstream's own code by thread and symbol (top 30)"
  limit=0.1 report --dsos modstream --sort comm,symbol | head -30
  if [ ${#graph[@]} -gt 0 ]; then
    echo; echo "## the modstream thread (the hub): functions with their callees' time (top 40)"
    perf report -i "$data" --children --stdio --comm modstream -g none --percent-limit 2 2>/dev/null \
      | grep -v '^#' | sed -e '/^$/d' -e 's/[ -]*$//' | head -40
  fi
} | tee "$out/profile.txt"
echo "profile: $out/profile.txt ($data)" >&2
