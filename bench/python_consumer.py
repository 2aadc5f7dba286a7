"""The moderation job written the usual way in Python, for the bench's
baseline: confluent-kafka consume(128) -> json -> (token models: the Hugging Face
tokenizer) -> onnxruntime (default session options, or INTRA_THREADS) -> one verdict per event -> produce -> flush -> commit.

    python_consumer.py BOOTSTRAP INPUT OUTPUT GROUP MODEL_DIR EVENTS [INTRA_THREADS]

INTRA_THREADS: ONNX Runtime's intra-op threads (0 or absent: its default
session options, a thread per core spinning between runs; 1: one thread,
the stronger baseline on a machine shared with the broker).

Stops after EVENTS verdicts; prints {"verdicts": n}. (Its peak RSS is read by
the bench from /proc/PID/status, as modstream's is.)
Verdict thresholds are modstream's defaults (review 0.5, block 0.85).
"""
import json
import sys

import numpy as np
import onnxruntime as ort
from confluent_kafka import Consumer, Producer

bootstrap, input_topic, output_topic, group, model_dir, want = sys.argv[1:7]
want = int(want)
intra_threads = int(sys.argv[7]) if len(sys.argv) > 7 else 0
manifest = json.load(open(f"{model_dir}/manifest.json"))
options = ort.SessionOptions()
if intra_threads > 0:
    options.intra_op_num_threads = intra_threads
    options.inter_op_num_threads = 1
session = ort.InferenceSession(f"{model_dir}/model.onnx", options, providers=["CPUExecutionProvider"])
output = manifest["output"]
input_name = manifest["inputs"][0]
tokens = manifest.get("input_kind") == "tokens"
if tokens:
    # A transformer the usual way: the Hugging Face tokenizer, each batch
    # padded to its longest post, truncated at max_length; softmax over logits.
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(f"{model_dir}/{manifest.get('tokenizer', 'tokenizer.json')}")
    tokenizer.enable_truncation(manifest.get("max_length", 128))
    tokenizer.enable_padding()
    config = json.load(open(f"{model_dir}/config.json"))
    labels = manifest.get("labels") or [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
else:
    labels = manifest["labels"]
score_index = labels.index(manifest["score_label"])


def probabilities_of(texts):
    if not tokens:
        return session.run([output], {input_name: np.array(texts, dtype=object).reshape(-1, 1)})[0]
    encoded = tokenizer.encode_batch(texts)
    feed = {
        "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64),
    }
    logits = session.run([output], {k: v for k, v in feed.items() if k in manifest["inputs"]})[0]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


consumer = Consumer({
    "bootstrap.servers": bootstrap,
    "group.id": group,
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
})
producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
consumer.subscribe([input_topic])

done = 0
while done < want:
    messages = consumer.consume(128, timeout=1.0)
    events = []
    for m in messages:
        if m.error():
            continue
        try:
            event = json.loads(m.value())
            events.append((m, event, str(event["text"])))
        except (ValueError, KeyError, TypeError):
            pass
    if events:
        probabilities = probabilities_of([t for _, _, t in events])
        for (m, event, _), p in zip(events, probabilities):
            score = float(p[score_index])
            verdict = "block" if score >= 0.85 else "review" if score >= 0.5 else "allow"
            record = {
                "event_id": event.get("event_id"),
                "verdict": verdict,
                "scores": {label: float(v) for label, v in zip(labels, p)},
                "model": {"name": manifest["name"], "version": manifest["version"]},
                "source": {"topic": m.topic(), "partition": m.partition(), "offset": m.offset()},
            }
            producer.produce(output_topic, json.dumps(record).encode(), key=m.key())
        producer.flush()
    if messages:
        consumer.commit(asynchronous=False)
    done += len(events)
consumer.close()
print(json.dumps({"verdicts": done}))
