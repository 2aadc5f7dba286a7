"""Checks rendered Kubernetes manifests offline, for tests/deploy.rs.

    kubectl kustomize deploy/k8s/overlays/cpu | python validate.py

Built-in kinds are checked against the Kubernetes OpenAPI schemas shipped in
kubernetes-validate (strict: unknown fields are errors). The KEDA
ScaledObject and the prometheus-operator PodMonitor and PrometheusRule are
checked against the cloudcoil models generated from those projects' CRD
schemas (cloudcoil-models-keda 2.16.1.0, cloudcoil-models-prometheus-operator
0.80.1.0): parsed with the model, and any field the model does not know is an
error. Prints the documents as JSON (for the test's cross-file checks) or
the errors on stderr and exits 1. Made by scripts/k8s-validate-venv.sh.
"""
import json
import sys

import kubernetes_validate
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from cloudcoil.models.prometheus_operator.v1 import PodMonitor, PrometheusRule

KUBERNETES = "1.32.0"
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): ScaledObject,
    ("monitoring.coreos.com/v1", "PodMonitor"): PodMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PrometheusRule,
}


def unknown(doc, model, path=""):
    """Paths present in the document and missing from the model's dump."""
    if isinstance(doc, dict) and isinstance(model, dict):
        out = []
        for key, value in doc.items():
            if key not in model:
                out.append(f"{path}.{key}")
            else:
                out += unknown(value, model[key], f"{path}.{key}")
        return out
    if isinstance(doc, list) and isinstance(model, list):
        return [p for i, (d, m) in enumerate(zip(doc, model)) for p in unknown(d, m, f"{path}[{i}]")]
    return []


docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
errors = []
for doc in docs:
    name = f'{doc["kind"]} {doc["metadata"]["name"]}'
    crd = CRDS.get((doc["apiVersion"], doc["kind"]))
    try:
        if crd is not None:
            model = crd.model_validate(doc)
            dump = model.model_dump(mode="json", by_alias=True, exclude_none=True)
            errors += [f"{name}: unknown field {p}" for p in unknown(doc, dump)]
        else:
            kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    except Exception as e:  # every validation error is reported, not raised
        errors.append(f"{name}: {str(e).splitlines()[0]}")
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
print(json.dumps(docs))
