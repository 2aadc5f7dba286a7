#!/usr/bin/env python3
"""Builds the null models: models that cost (almost) nothing, so that a bench
measures the service's own cost per verdict (decode, batch, policy, verdict,
Kafka in and out; tokenization for the token model) rather than a model's.

- null-text: a text model (`text`, strings [N, 1]) whose output
  `probabilities` [N, 2] is the constant [1, 0] (clean, offensive) per row.
- null-tokens: a token model (`input_ids`, `attention_mask`,
  `token_type_ids`, int64 [N, L]) whose output `logits` [N, 2] is the
  constant [2, -2] per row; the MiniLM tokenizer in front (its tokenizer.json
  and config.json copied from TOKENIZER_DIR).

Each output is shaped from the input's batch dimension (Shape, Slice,
Concat, ConstantOfShape, Add): no work per token or character.

Usage: build_null_models.py OUT_DIR [TOKENIZER_DIR]
"""
import json
import pathlib
import shutil
import sys

import onnx
from onnx import TensorProto, helper


def constant_rows(first_input, row, output):
    """Nodes and initializers for `output` = `row` repeated per row of
    `first_input` (its first dimension)."""
    nodes = [
        helper.make_node("Shape", [first_input], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["rows"]),
        helper.make_node("Concat", ["rows", "width"], ["out_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["out_shape"], ["zeros"],
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0])),
        helper.make_node("Add", ["zeros", "row"], [output]),
    ]
    inits = [
        helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        helper.make_tensor("width", TensorProto.INT64, [1], [len(row)]),
        helper.make_tensor("row", TensorProto.FLOAT, [len(row)], row),
    ]
    return nodes, inits


def save(graph, out, manifest):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out / "model.onnx")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print("wrote", out)


def null_text(out):
    nodes, inits = constant_rows("text", [1.0, 0.0], "probabilities")
    graph = helper.make_graph(
        nodes, "null-text",
        [helper.make_tensor_value_info("text", TensorProto.STRING, [None, 1])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 2])],
        initializer=inits,
    )
    save(graph, out, {
        "name": "null-text", "version": "1", "input_kind": "text",
        "inputs": ["text"], "output": "probabilities",
        "labels": ["clean", "offensive"], "score_label": "offensive",
        "source": "scripts/build_null_models.py: constant probabilities, for measuring the service's own cost (bench only)",
    })


def null_tokens(out, tokenizer_dir):
    nodes, inits = constant_rows("input_ids", [2.0, -2.0], "logits")
    # The mask and type ids are declared inputs (the service feeds them, as
    # it feeds MiniLM) that no node reads.
    names = ["input_ids", "attention_mask", "token_type_ids"]
    graph = helper.make_graph(
        nodes, "null-tokens",
        [helper.make_tensor_value_info(n, TensorProto.INT64, [None, None]) for n in names],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 2])],
        initializer=inits,
    )
    base = json.loads((tokenizer_dir / "manifest.json").read_text())
    save(graph, out, {
        "name": "null-tokens", "version": "1", "input_kind": "tokens",
        "inputs": names, "output": "logits",
        "tokenizer": "tokenizer.json", "max_length": base.get("max_length", 128),
        "labels": ["clean", "offensive"], "score_label": "offensive",
        "source": "scripts/build_null_models.py: constant logits behind the MiniLM tokenizer of "
                  + base.get("name", "?") + ", for measuring the service's own cost (bench only)",
    })
    for f in ["tokenizer.json", "config.json"]:
        if (tokenizer_dir / f).exists():
            shutil.copy(tokenizer_dir / f, out / f)


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1])
    null_text(out / "null-text")
    if len(sys.argv) > 2:
        null_tokens(out / "null-tokens", pathlib.Path(sys.argv[2]))
