"""Quantize the MiniLM-L6 moderation model to int8 and measure what it costs.

Writes OUT_DIR/int8/ beside the fp32 model of scripts/build_minilm_model.py:
model.onnx (onnxruntime.quantization.quantize_dynamic, QInt8 weights),
tokenizer.json, config.json and a manifest of its own (version
"<fp32 version>-int8") recording, on a held-out set, the share of posts
whose verdict at 0.5 (`offensive`) agrees with fp32 and the largest
difference of a probability. The held-out set: the labelled posts of
data/sample_posts.txt and generated posts of every length from 1 word to
past the model's 128 tokens (words of those posts, in a fixed order).

Usage: quantize_minilm_model.py OUT_DIR REPO_ROOT
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from tokenizers import Tokenizer


def held_out(repo):
    posts = [line.split("|", 1)[1]
             for line in (repo / "data/sample_posts.txt").read_text().splitlines()
             if line and not line.startswith("#") and "|" in line]
    words = " ".join(posts).split()
    generated = []
    for n in range(1, 161, 3):
        start = (n * 7) % len(words)
        generated.append(" ".join((words * 3)[start:start + n]))
    return posts + generated


def probabilities(model_path, tokenizer, texts):
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    out = []
    for t in texts:
        e = tokenizer.encode(t)
        feed = {
            "input_ids": np.array([e.ids], np.int64),
            "attention_mask": np.ones((1, len(e.ids)), np.int64),
            "token_type_ids": np.array([e.type_ids], np.int64),
        }
        (logits,) = sess.run(["logits"], feed)
        z = logits[0] - logits[0].max()
        out.append(np.exp(z) / np.exp(z).sum())
    return np.array(out)


def main():
    out_dir, repo = (Path(a) for a in sys.argv[1:3])
    manifest = json.loads((out_dir / "manifest.json").read_text())
    int8 = out_dir / "int8"
    int8.mkdir(parents=True, exist_ok=True)
    quantize_dynamic(str(out_dir / "model.onnx"), str(int8 / "model.onnx"), weight_type=QuantType.QInt8)
    for f in ("tokenizer.json", "config.json"):
        shutil.copy(out_dir / f, int8 / f)
    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(manifest["max_length"])
    texts = held_out(repo)
    fp32 = probabilities(out_dir / "model.onnx", tokenizer, texts)
    q = probabilities(int8 / "model.onnx", tokenizer, texts)
    offensive = 1  # LABELS = ["clean", "offensive"]
    agreement = float(np.mean((fp32[:, offensive] >= 0.5) == (q[:, offensive] >= 0.5)))
    max_diff = float(np.abs(fp32 - q).max())
    print(f"int8: {len(texts)} held-out posts, verdicts at 0.5 agree on {agreement * 100:.1f} %, "
          f"largest probability difference {max_diff:.4f}")
    manifest["version"] = manifest["version"] + "-int8"
    manifest["quantization"] = {
        "method": "onnxruntime.quantization.quantize_dynamic, QInt8 weights (onnxruntime 1.31.1)",
        "reference": f"{manifest['name']} fp32",
        "held_out_posts": len(texts),
        "verdict_agreement": round(agreement, 4),
        "max_probability_difference": round(max_diff, 4),
    }
    (int8 / "manifest.json").write_text(json.dumps(manifest, indent=2))
    print(f"wrote {int8}")


if __name__ == "__main__":
    main()
