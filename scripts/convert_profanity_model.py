#!/usr/bin/env python3
"""Convert the alt-profanity-check model (PyPI, MIT) to ONNX for modstream.

The package ships a scikit-learn TfidfVectorizer and a CalibratedClassifierCV
over a LinearSVC. This script joins them into one pipeline, converts it with
skl2onnx (string input `text` [N,1] -> `probabilities` [N,2]), checks the ONNX
graph against scikit-learn on sample posts, and only then writes
`model.onnx` and `manifest.json` into the output directory.

Usage (in a virtualenv):
  pip install alt-profanity-check==1.9.1 scikit-learn==1.9.1 joblib==1.6.0 \
      skl2onnx==1.20.0 onnx onnxruntime==1.31.1
  python scripts/convert_profanity_model.py models/profanity-check
"""
import json
import pathlib
import sys

import numpy as np
import onnx
import onnxruntime as ort
from profanity_check import profanity_check as pc
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import StringTensorType
from sklearn.pipeline import Pipeline

OUT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "models/profanity-check")
SAMPLES = pathlib.Path(__file__).resolve().parent.parent / "data" / "sample_posts.txt"

pipe = Pipeline([("tfidf", pc.vectorizer), ("clf", pc.model)])
onx = convert_sklearn(
    pipe,
    initial_types=[("text", StringTensorType([None, 1]))],
    options={id(pc.model): {"zipmap": False}},
    target_opset={"": 17, "ai.onnx.ml": 3},
)

# skl2onnx writes locale en_US.UTF-8, which minimal Linux images lack; ONNX
# Runtime then refuses the model. C.UTF-8 exists everywhere.
for node in onx.graph.node:
    if node.op_type == "StringNormalizer":
        for attr in node.attribute:
            if attr.name == "locale":
                attr.s = b"C.UTF-8"
        if not any(a.name == "locale" for a in node.attribute):
            node.attribute.append(onnx.helper.make_attribute("locale", "C.UTF-8"))

# skl2onnx turns scikit-learn's token pattern (?u)\b\w\w+\b into the ASCII-only
# [a-zA-Z0-9_]+, which splits "café" into "caf". Python's \w is Unicode-aware:
# letters, digits and underscore. RE2 (ONNX Runtime's Tokenizer) says that as:
for node in onx.graph.node:
    if node.op_type == "Tokenizer":
        for attr in node.attribute:
            if attr.name == "tokenexp":
                attr.s = rb"[\p{L}\p{N}_]+"

outputs = [o.name for o in onx.graph.output]
assert "probabilities" in outputs, outputs

texts = [line.split("|", 1)[1] for line in SAMPLES.read_text().splitlines()
         if line and not line.startswith("#")]
texts += ["", "a", "I  love   whitespace", "MiXeD CaSe FUCK", "emoji 😀 fuck 😡", "café naïve façade", "CAFÉ ÉCOLE Straße", "Привет МИР fuck", "مرحبا بالعالم", "e\u0301te\u0301 combining", "under_score x2 42abc"]
sess = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
got = sess.run(["probabilities"], {"text": np.array(texts, dtype=object).reshape(-1, 1)})[0]
want = pipe.predict_proba(texts)
diff = float(np.max(np.abs(got - want)))
print(f"checked {len(texts)} texts: max |onnx - sklearn| = {diff:.2e}")
if diff > 1e-4:
    for t, g, w in zip(texts, got[:, 1], want[:, 1]):
        if abs(g - w) > 1e-4:
            print(f"  mismatch {g:.4f} vs {w:.4f}: {t!r}")
    sys.exit("ONNX model disagrees with scikit-learn; not writing it")

OUT.mkdir(parents=True, exist_ok=True)
onnx.save(onx, OUT / "model.onnx")
manifest = {
    "name": "alt-profanity-check",
    "version": "1.9.1",
    "input_kind": "text",
    "inputs": ["text"],
    "output": "probabilities",
    "labels": ["clean", "offensive"],
    "score_label": "offensive",
    "source": "PyPI alt-profanity-check 1.9.1 (MIT): TF-IDF + calibrated LinearSVC, converted by scripts/convert_profanity_model.py",
}
(OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
print(f"wrote {OUT / 'model.onnx'} ({(OUT / 'model.onnx').stat().st_size} bytes)")
