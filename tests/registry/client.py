"""The Schema Registry tests' real client: confluent-kafka's producer with
its AvroSerializer / ProtobufSerializer / JSONSerializer and
SchemaRegistryClient, and its AvroDeserializer to read verdicts back.

  client.py produce BOOTSTRAP REGISTRY TOPIC FORMAT START COUNT [--hold]
      FORMAT: avro (schema v1), avro2 (v2: adds `community`), protobuf,
      json_schema. Event ids are FORMAT-<i>. With --hold: the schema is
      registered first, "registered" printed, and the records produced
      once a line arrives on stdin (the registry may be down by then: the
      client's cache holds the id, as a long-running producer's does).
  client.py verdicts BOOTSTRAP REGISTRY TOPIC COUNT TIMEOUT_S
      Prints each verdict read with the AvroDeserializer, one JSON per line.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

AVRO_V1 = {
    "type": "record", "name": "Post", "namespace": "feed",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "title", "type": "string"},
        {"name": "body", "type": "string"},
        {"name": "created_utc", "type": "double"},
    ],
}
AVRO_V2 = dict(AVRO_V1, fields=AVRO_V1["fields"] + [
    {"name": "community", "type": "string", "default": ""},
])
JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Post", "type": "object",
    "properties": {
        "id": {"type": "string"}, "title": {"type": "string"},
        "body": {"type": "string"}, "created_utc": {"type": "number"},
        "community": {"type": "string"},
    },
    "required": ["id", "title", "body"],
}
PROTO = """syntax = "proto3";
package feed;
message Post {
  string id = 1;
  string title = 2;
  string body = 3;
  double created_utc = 4;
  string community = 5;
}
"""


def post_message_class():
    """The Post message class, compiled from PROTO by protoc (grpcio-tools)."""
    out = tempfile.mkdtemp()
    with open(os.path.join(out, "post.proto"), "w") as f:
        f.write(PROTO)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}", "post.proto"],
        check=True,
    )
    sys.path.insert(0, out)
    import post_pb2  # noqa: E402

    return post_pb2.Post


def post(fmt, i):
    value = {
        "id": f"{fmt}-{i}",
        "title": f"post {i}",
        "body": "a perfectly ordinary post about the weekend",
        "created_utc": time.time(),
    }
    if fmt != "avro":
        value["community"] = "hiking"
    return value


def serializer(fmt, registry):
    if fmt in ("avro", "avro2"):
        schema = json.dumps(AVRO_V1 if fmt == "avro" else AVRO_V2)
        return AvroSerializer(registry, schema, lambda v, ctx: v), None
    if fmt == "json_schema":
        return JSONSerializer(json.dumps(JSON_SCHEMA), registry, lambda v, ctx: v), None
    if fmt == "protobuf":
        cls = post_message_class()
        return ProtobufSerializer(cls, registry, {"use.deprecated.format": False}), cls
    raise SystemExit(f"unknown format {fmt}")


def produce(bootstrap, registry_url, topic, fmt, start, count, hold):
    registry = SchemaRegistryClient({"url": registry_url})
    ser, cls = serializer(fmt, registry)
    ctx = SerializationContext(topic, MessageField.VALUE)

    def encode(i):
        v = post(fmt, i)
        if cls is not None:
            v = cls(**v)
        return ser(v, ctx)

    first = encode(start)  # registers the schema (and caches its id)
    if hold:
        print("registered", flush=True)
        sys.stdin.readline()
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failed = []
    for i in range(start, start + count):
        value = first if i == start else encode(i)
        producer.produce(topic, key=f"user-{i % 13}", value=value,
                         on_delivery=lambda err, msg: err and failed.append(err))
        producer.poll(0)
    producer.flush(60)
    if failed:
        raise SystemExit(f"{len(failed)} records not delivered: {failed[0]}")
    print(f"produced {count}", flush=True)


def verdicts(bootstrap, registry_url, topic, count, timeout_s):
    registry = SchemaRegistryClient({"url": registry_url})
    de = AvroDeserializer(registry)
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"avro-reader-{time.time()}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    seen, deadline = 0, time.time() + timeout_s
    while seen < count and time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        value = de(msg.value(), SerializationContext(topic, MessageField.VALUE))
        headers = {k: v.decode() for k, v in (msg.headers() or [])}
        print(json.dumps({"value": value, "headers": headers}), flush=True)
        seen += 1
    consumer.close()


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "produce":
        produce(args[0], args[1], args[2], args[3], int(args[4]), int(args[5]), "--hold" in args)
    elif cmd == "verdicts":
        verdicts(args[0], args[1], args[2], int(args[3]), float(args[4]))
    else:
        raise SystemExit(__doc__)
