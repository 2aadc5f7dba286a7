# modstream image: the same binary and features as the tests (cargo build
# --release --locked), with the ONNX Runtime library from the PyPI wheel.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY data data
COPY models models
COPY config config
RUN cargo build --release --locked

FROM python:3.11-slim-bookworm AS onnxruntime
COPY scripts/fetch-onnxruntime.sh /fetch-onnxruntime.sh
RUN MODSTREAM_CACHE_DIR=/ort bash /fetch-onnxruntime.sh

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/modstream /usr/local/bin/modstream
COPY --from=onnxruntime /ort/onnxruntime-1.31.1/ /opt/onnxruntime/
COPY models /app/models
COPY config /app/config
ENV ORT_DYLIB_PATH=/opt/onnxruntime/libonnxruntime.so.1.31.1
WORKDIR /app
USER 65534
ENTRYPOINT ["modstream"]
CMD ["run"]
