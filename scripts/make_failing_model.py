#!/usr/bin/env python3
"""Builds tests/data/failing-model: a tiny ONNX model that parses each text as
a number (Cast string -> float) and fails the whole run on any text that is
not one. The tests use it to check that a failing model run is retried event
by event and only the bad events are dead-lettered.

Usage: python scripts/make_failing_model.py tests/data/failing-model
"""
import json, pathlib, sys
import onnx
from onnx import TensorProto, helper

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/failing-model")
nodes = [
    helper.make_node("Cast", ["text"], ["x"], to=TensorProto.FLOAT),   # fails on non-numbers
    helper.make_node("Sigmoid", ["x"], ["p"]),
    helper.make_node("Sub", ["one", "p"], ["q"]),
    helper.make_node("Concat", ["q", "p"], ["probabilities"], axis=1),
]
graph = helper.make_graph(
    nodes, "failing",
    [helper.make_tensor_value_info("text", TensorProto.STRING, [None, 1])],
    [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 2])],
    initializer=[helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.checker.check_model(model)
out.mkdir(parents=True, exist_ok=True)
onnx.save(model, out / "model.onnx")
(out / "manifest.json").write_text(json.dumps({
    "name": "failing-test-model", "version": "1", "input_kind": "text",
    "inputs": ["text"], "output": "probabilities",
    "labels": ["clean", "offensive"], "score_label": "offensive",
    "source": "scripts/make_failing_model.py (tests only)"}, indent=2) + "\n")
print("wrote", out)
