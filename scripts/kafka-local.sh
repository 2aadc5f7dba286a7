#!/usr/bin/env bash
# Runs a single-node Apache Kafka 4.4 (KRaft) on 127.0.0.1 in the
# foreground, from the jars scripts/fetch-kafka.sh caches and the tests'
# broker settings (tests/kafka/server.properties), with its data in a fresh
# temporary directory removed on exit. For `modstream bench --bootstrap`
# and trying modstream against real Kafka without Docker.
#   scripts/kafka-local.sh [PORT]        # default 9092; Ctrl-C stops it
# Prints "kafka-local: ready at 127.0.0.1:PORT" once it accepts clients.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-9092}
controller=$((port + 1))
libs=$(scripts/fetch-kafka.sh | tail -n 1)
dir=$(mktemp -d -t modstream-kafka-XXXXXX)
trap 'kill "${pid:-0}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT INT TERM
sed -e "s|@NODE_ID@|1|; s|@VOTERS@|1@127.0.0.1:$controller|" \
    -e "s|@LISTENERS@|PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller|" \
    -e "s|@ADVERTISED@|PLAINTEXT://127.0.0.1:$port|; s|@LOG_DIR@|$dir/data|" \
    -e "s|@REPLICATION@|1|g; s|@MIN_ISR@|1|g" tests/kafka/server.properties > "$dir/server.properties"
printf '%s\n' rootLogger.level=WARN rootLogger.appenderRef.stdout.ref=STDOUT \
  appender.stdout.type=Console appender.stdout.name=STDOUT \
  appender.stdout.layout.type=PatternLayout 'appender.stdout.layout.pattern=[%d] %p %m (%c)%n' \
  > "$dir/log4j2.properties"
# The JVM options of Kafka's own kafka-server-start.sh (1 GiB heap, G1 with
# a 20 ms pause target): a broker as users run it, for benchmarks (the tests
# use a small heap and the serial collector instead). GC log: $dir/gc.log.
java_opts=(-Xms1g -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
           -XX:+ExplicitGCInvokesConcurrent "-Xlog:gc:file=$dir/gc.log"
           "-Dlog4j2.configurationFile=$dir/log4j2.properties" -cp "$libs/*")
cluster_id=$(java "${java_opts[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
java "${java_opts[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" >/dev/null
java "${java_opts[@]}" kafka.Kafka "$dir/server.properties" &
pid=$!
for _ in $(seq 1 300); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "kafka-local: ready at 127.0.0.1:$port (data in $dir)"
    wait "$pid"
    exit $?
  fi
  kill -0 "$pid" 2>/dev/null || { echo "kafka-local: the broker exited at start" >&2; exit 1; }
  sleep 0.2
done
echo "kafka-local: not listening on $port after 60 s" >&2
exit 1
