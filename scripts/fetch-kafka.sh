#!/usr/bin/env bash
# Fetches Apache Kafka 4.4.0 (the broker the tests run) from Maven Central:
# `mvn dependency:copy-dependencies` over tests/kafka/pom.xml collects the
# jars of kafka_2.13, kafka-server, kafka-tools and a log4j2 binding into the
# modstream cache (Maven's own repository kept there too). Needs Java 17+ and
# Maven. Reruns are instant. Prints the jars' folder on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${MODSTREAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modstream}
dest="$cache/kafka-4.4.0"
stamp="$dest/libs/.pom-$(sha256sum tests/kafka/pom.xml | cut -c1-16)"
if [ -f "$stamp" ]; then echo "$dest/libs"; exit 0; fi
command -v java >/dev/null || { echo "fetch-kafka: java not found; install OpenJDK 17+ (Debian: openjdk-17-jre-headless)" >&2; exit 1; }
command -v mvn >/dev/null || { echo "fetch-kafka: mvn not found; install Maven (Debian: maven)" >&2; exit 1; }
major=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = \([0-9]*\).*/\1/p')
[ "${major:-0}" -ge 17 ] || { echo "fetch-kafka: Kafka 4.x needs Java 17+, found ${major:-unknown}" >&2; exit 1; }
echo "fetch-kafka: collecting Apache Kafka 4.4.0's jars from Maven Central (first run only)" >&2
rm -rf "$dest.partial"
if ! mvn -B -q -f tests/kafka/pom.xml -Dmaven.repo.local="$cache/maven-repo" \
     dependency:copy-dependencies -Dmdep.includeScope=runtime \
     -DoutputDirectory="$dest.partial" >&2; then
  echo "fetch-kafka: mvn could not fetch Apache Kafka 4.4.0 (see above); the Kafka tests need it" >&2
  exit 1
fi
[ -f "$dest.partial/kafka_2.13-4.4.0.jar" ] || { echo "fetch-kafka: kafka_2.13-4.4.0.jar missing" >&2; exit 1; }
rm -rf "$dest"; mkdir -p "$dest"; mv "$dest.partial" "$dest/libs"
touch "$stamp"
echo "$dest/libs"
