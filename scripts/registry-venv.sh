#!/usr/bin/env bash
# Makes the Python venv of the Schema Registry tests: confluent-kafka with
# its Schema Registry serializers (Avro, Protobuf, JSON Schema), and
# grpcio-tools (protoc, for the test's .proto), from PyPI, in the modstream
# cache. Reruns are instant. Prints the interpreter path.
set -euo pipefail
cache=${MODSTREAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modstream}
venv="$cache/py-registry"
check='import confluent_kafka.schema_registry.avro, confluent_kafka.schema_registry.protobuf, confluent_kafka.schema_registry.json_schema, grpc_tools.protoc'
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "$check" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "confluent-kafka[avro,protobuf,json,schemaregistry]==2.*" grpcio-tools >&2
  "$venv/bin/python" -c "$check"
fi
echo "$venv/bin/python"
