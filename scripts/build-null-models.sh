#!/usr/bin/env bash
# Builds the null models into models/null-text and models/null-tokens
# (scripts/build_null_models.py): constant outputs, for measuring the
# service's own cost per verdict. The token one takes the MiniLM tokenizer,
# so MiniLM is built first (scripts/build-minilm-model.sh, cached). Prints
# the two directories.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${MODSTREAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modstream}
scripts/build-minilm-model.sh > /dev/null
# The private environment the MiniLM build made (a venv, or packages in a
# --target directory where Python lacks the venv module).
venv="$cache/py-venv"
if [ -x "$venv/bin/python" ]; then py=("$venv/bin/python"); else py=(env "PYTHONPATH=$venv/site" python3); fi
if ! "${py[@]}" -c "import onnx" 2>/dev/null; then
  mkdir -p "$cache/null-models-py"
  python3 -m pip install --quiet --disable-pip-version-check --target "$cache/null-models-py" onnx==1.23.2
  py=(env "PYTHONPATH=$cache/null-models-py" python3)
fi
"${py[@]}" scripts/build_null_models.py models models/minilm-l6-int8 > /dev/null
echo models/null-text
echo models/null-tokens
