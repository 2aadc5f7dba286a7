#!/usr/bin/env bash
# Makes the Python venv that checks the Kubernetes manifests offline
# (deploy/k8s/validate.py): kubernetes-validate (the built-in kinds'
# OpenAPI schemas, shipped in the package), the cloudcoil models of the KEDA
# and prometheus-operator CRDs (pydantic, generated from their CRD schemas),
# and PyYAML; from PyPI, in the modstream cache. Reruns are instant.
# Prints the interpreter path.
set -euo pipefail
cache=${MODSTREAM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/modstream}
venv="$cache/k8s-validate"
check='import kubernetes_validate, yaml, cloudcoil.models.keda.v1alpha1, cloudcoil.models.prometheus_operator.v1'
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "$check" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "kubernetes-validate==1.37.0" "cloudcoil-models-keda==2.16.1.0" \
    "cloudcoil-models-prometheus-operator==0.80.1.0" pyyaml >&2
fi
echo "$venv/bin/python"
