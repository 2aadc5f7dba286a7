#!/usr/bin/env bash
# GPU check: check-model and the bench with the CUDA execution provider, on a
# machine with an NVIDIA GPU and no network (the device machines: CUDA 13
# runtime, cuBLAS and cuDNN as pip packages under their Python).
#
#   scripts/gpu-check.sh pack   # here: release binary, onnxruntime-gpu 1.31.1
#                               # libraries, the MiniLM model, OpenSSL; split
#                               # into target/gpu-pack/part-NN (<= 60 MiB each)
#   scripts/gpu-check.sh run    # there: reassemble, verify, run; writes
#                               # target/gpu-check/report.json (+ bench.json)
#
# The parts travel one per call (each call carries at most 64 MiB); a warm
# device machine keeps the earlier ones. Budget: the run itself takes
# 2-3 minutes (model load, warm-up, bench of 4 batch sizes on 4,096 posts).
set -euo pipefail
cd "$(dirname "$0")/.."
pack=target/gpu-pack
part_size=$((60 * 1024 * 1024))

case "${1:-}" in
pack)
  cargo build --release --locked
  lib=$(ORT_WHEEL=onnxruntime-gpu scripts/fetch-onnxruntime.sh | tail -n 1)
  scripts/build-minilm-model.sh >/dev/null
  stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/lib" "$stage/model"
  cp target/release/modstream target/release/modstream-bench "$stage/"
  cp "$(dirname "$lib")"/libonnxruntime* "$stage/lib/"
  cp /lib/x86_64-linux-gnu/libssl.so.3 /lib/x86_64-linux-gnu/libcrypto.so.3 "$stage/lib/"
  cp models/minilm-l6/{model.onnx,tokenizer.json,config.json,manifest.json} "$stage/model/"
  rm -rf "$pack"; mkdir -p "$pack"
  tar -C "$stage" -czf - . | split -b "$part_size" -d - "$pack/part-"
  (cd "$pack" && sha256sum part-* > SHA256SUMS)
  ls -l "$pack"
  echo "carry each of $pack/part-* (and $pack/SHA256SUMS) in its own call, then: scripts/gpu-check.sh run"
  ;;
run)
  out=target/gpu-check
  rm -rf "$out"; mkdir -p "$out/pkg"
  (cd "$pack" && sha256sum -c SHA256SUMS)
  cat "$pack"/part-* | tar -C "$out/pkg" -xzf -
  # CUDA libraries from pip packages (nvidia-*), wherever Python keeps them.
  cuda_libs=$(python3 - <<'PY' 2>/dev/null || true
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
dirs = sorted({os.path.dirname(p) for r in roots if os.path.isdir(r)
               for p in glob.glob(os.path.join(r, "nvidia", "**", "lib*.so*"), recursive=True)})
print(":".join(dirs))
PY
)
  export LD_LIBRARY_PATH="$out/pkg/lib${cuda_libs:+:$cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export ORT_DYLIB_PATH="$PWD/$out/pkg/lib/libonnxruntime.so.1.31.1"
  bin="$out/pkg/modstream"
  # GPU_CHECK_PROVIDERS=cpu runs the same plumbing without a GPU (a dry run).
  providers=${GPU_CHECK_PROVIDERS:-cuda,cpu}
  require=(); [ "$providers" = cpu ] || require=(--require-gpu)
  events=${GPU_CHECK_EVENTS:-4096}
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1 || true
  set +e
  timeout 120 "$bin" check-model --model "$out/pkg/model" --providers "$providers" "${require[@]}" \
    "have a lovely day" "you are a worthless idiot" > "$out/check-model.txt" 2>&1
  check_rc=$?
  timeout 300 "$bin" bench --model "$out/pkg/model" --providers "$providers" "${require[@]}" \
    --events "$events" --batch-sizes 1,16,64,256 --delays-ms 10 --loads 0.5,0.9 \
    --latency-seconds 5 --overload 0 --out "$out" > "$out/bench.txt" 2>&1
  bench_rc=$?
  set -e
  python3 - "$out" "$check_rc" "$bench_rc" <<'PY'
import json, pathlib, sys
out, check_rc, bench_rc = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
read = lambda n: (out / n).read_text(errors="replace") if (out / n).exists() else ""
bench = json.loads(read("bench.json")) if read("bench.json") else None
report = {"gpu": read("gpu.txt").strip(), "check_model_rc": check_rc, "check_model": read("check-model.txt"),
          "bench_rc": bench_rc, "bench": bench, "bench_log_tail": read("bench.txt")[-4000:]}
(out / "report.json").write_text(json.dumps(report, indent=1))
print(json.dumps({k: v for k, v in report.items() if k != "bench"}, indent=1))
PY
  ;;
*)
  echo "usage: scripts/gpu-check.sh pack|run" >&2; exit 2 ;;
esac
