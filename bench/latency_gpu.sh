#!/usr/bin/env bash
# One GPU-machine run for issues 5 and 7, from prebuilt binaries (make gpu-bundle) in this script's folder:
#   tests   the GPU tests (tests/gpu/run.sh: kernels, fixtures, graphs, engine on CUDA)
#   20b     make-model gpt-oss-20b to local disk, then `bench latency` at 1K and 8K prompts (start-up from page cache),
#           with --breakdown, plus the same without CUDA graphs at batch 1 and 32
#   120b    `bench latency --preset gpt-oss-120b` (weights synthesized in memory: the checkpoint is 65 GB)
# Usage: bench/latency_gpu.sh [tests] [20b] [120b]   (default: all). Logs and JSON go to $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/mx-latency-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
if ! ls /usr/local/cuda/lib64/libcublasLt.so.13 >/dev/null 2>&1; then
  lt=$(find / -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)
  [[ -n $lt ]] && export LD_LIBRARY_PATH=$(dirname "$lt"):$LD_LIBRARY_PATH
fi
steps=${*:-tests 20b 120b}
{
  echo "== $(date -u) commit ${MX_COMMIT:-unknown} steps: $steps"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nproc; free -g; df -h /tmp /dev/shm
} >"$OUT/env.txt" 2>&1
bench=(--batch-size 1,8,32,128 --input-len 1024,8192 --output-len 128 --breakdown)
for step in $steps; do
  case $step in
    tests)
      OUT=/tmp/mx-gpu-tests "$here/run.sh" "$here" >/dev/null 2>&1
      echo "run.sh exit $?" >>"$OUT/env.txt"
      cp /tmp/mx-gpu-tests/gpu_tests.log /tmp/mx-gpu-tests/gpu_table.txt "$OUT/" ;;
    20b)
      { time "$here/mxserve" make-model --preset gpt-oss-20b --out /tmp/g20 --threads 16
        sync; echo "== bench latency 20b (graphs)"
        "$here/mxserve" bench latency --model /tmp/g20 "${bench[@]}" --json "$OUT/bench_20b.json"
        echo "== bench latency 20b (--disable-cuda-graph)"
        "$here/mxserve" bench latency --model /tmp/g20 --batch-size 1,32 --input-len 1024 --output-len 64 \
          --disable-cuda-graph --json /tmp/bench_20b_eager.json && cat /tmp/bench_20b_eager.json
      } >"$OUT/bench_20b.log" 2>&1
      rm -rf /tmp/g20 ;;
    120b)
      "$here/mxserve" bench latency --preset gpt-oss-120b --threads 16 "${bench[@]}" \
        --json "$OUT/bench_120b.json" >"$OUT/bench_120b.log" 2>&1 ;;
  esac
done
ls -la "$OUT"
for f in "$OUT"/*.log; do echo "== $f"; tail -n 12 "$f"; done
