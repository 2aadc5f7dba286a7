# modstream image: the service's package only (cargo build --release --locked
# -p modstream: the bench stays out, and with it the `charts` feature that
# only `prevalence --chart` and `--widths` use), with the ONNX Runtime library
# from the PyPI wheel.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
# The workspace's other member: cargo reads its manifest even when it builds
# only the service.
COPY bench bench
COPY data data
COPY models models
COPY config config
RUN cargo build --release --locked -p modstream

FROM python:3.11-slim-bookworm AS onnxruntime
COPY scripts/fetch-onnxruntime.sh /fetch-onnxruntime.sh
RUN MODSTREAM_CACHE_DIR=/ort bash /fetch-onnxruntime.sh

# The GPU image: `docker build --target gpu .` (deploy/k8s/overlays/gpu).
# ONNX Runtime's CUDA build from the onnxruntime-gpu wheel, with the CUDA 13
# and cuDNN libraries from their PyPI wheels (as scripts/gpu-check.sh does);
# the node provides the driver. Run scripts/build-minilm-model.sh first so
# that models/minilm-l6 is in the build context. Not built or run here (no Docker engine, no
# GPU in this project's sessions so far).
FROM python:3.11-slim-bookworm AS onnxruntime-gpu
COPY scripts/fetch-onnxruntime.sh /fetch-onnxruntime.sh
RUN ORT_WHEEL=onnxruntime-gpu MODSTREAM_CACHE_DIR=/ort bash /fetch-onnxruntime.sh
# The CUDA and cuDNN libraries the wheel's "cuda" and "cudnn" extras name.
RUN pip install --no-cache-dir --target /cuda "nvidia-cuda-nvrtc~=13.0" \
    "nvidia-cuda-runtime~=13.0" "nvidia-cufft~=12.0" "nvidia-curand~=10.0" \
    "nvidia-cudnn-cu13~=9.0" \
 && mkdir -p /cuda/lib && find /cuda/nvidia -name 'lib*.so*' -exec cp -a {} /cuda/lib/ \;

FROM debian:bookworm-slim AS gpu
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/modstream /usr/local/bin/modstream
COPY --from=onnxruntime-gpu /ort/onnxruntime-gpu-1.31.1/ /opt/onnxruntime/
COPY --from=onnxruntime-gpu /cuda/lib /opt/cuda/lib
COPY models /app/models
COPY config /app/config
ENV ORT_DYLIB_PATH=/opt/onnxruntime/libonnxruntime.so.1.31.1
ENV LD_LIBRARY_PATH=/opt/cuda/lib
ENV MODSTREAM__INFERENCE__EXECUTION_PROVIDERS=cuda,cpu
WORKDIR /app
USER 65534
ENTRYPOINT ["modstream"]
CMD ["run"]

# The CPU image, the default target (last, so that `docker build .` and
# docker-compose build it).
FROM debian:bookworm-slim AS cpu
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
