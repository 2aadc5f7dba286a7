#!/usr/bin/env bash
# Makes the Python venv for the bench's "plain Python consumer" baseline
# (bench/python_consumer.py): confluent-kafka (bundles librdkafka),
# onnxruntime 1.31.1 (the version modstream loads), numpy and tokenizers
# (for token models), from PyPI,
# in the modstream cache. Reruns are instant. Prints the interpreter path.
set -euo pipefail
cache=${MODSTREAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modstream}
venv="$cache/py-baseline"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import confluent_kafka, onnxruntime, numpy, tokenizers' 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "confluent-kafka==2.*" "onnxruntime==1.31.1" numpy "tokenizers==0.*" >&2
fi
echo "$venv/bin/python"
