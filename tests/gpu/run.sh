#!/usr/bin/env bash
# GPU test run from prebuilt binaries (make build-gpu): every kernel vs its CPU twin, the tiny fixtures end
# to end, graph replay vs eager, and `mxserve generate --backend cuda` vs cpu. Prints the pass/fail table;
# writes the full log to $OUT (default /tmp/mx-gpu-out).
# Usage: tests/gpu/run.sh [directory with mx_gpu_tests and mxserve]   (default: this script's directory,
# then ./build-gpu)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here}
[[ -x $bin/mx_gpu_tests ]] || bin=$(pwd)/build-gpu
OUT=${OUT:-/tmp/mx-gpu-out}
mkdir -p "$OUT"
if [[ -z ${MX_FIXTURES_DIR:-} ]]; then
  for d in "$here/../fixtures" "$here/../tests/fixtures" "$(pwd)/tests/fixtures"; do
    [[ -d $d/tiny-gpt-oss ]] && MX_FIXTURES_DIR=$(cd "$d" && pwd) && break
  done
fi
export MX_FIXTURES_DIR
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
# cuBLASLt 13: the toolkit's, else the one PyTorch's wheels ship.
if ! ls /usr/local/cuda/lib64/libcublasLt.so.13 >/dev/null 2>&1; then
  lt=$(find / -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)
  [[ -n $lt ]] && export LD_LIBRARY_PATH=$(dirname "$lt"):$LD_LIBRARY_PATH
fi
log=$OUT/gpu_tests.log
{
  echo "== $(date -u) commit ${MX_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
} | tee "$log"
MX_GPU_REPORT=$OUT/gpu_table.txt "$bin/mx_gpu_tests" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
cli_fail=0
for fx in tiny-gpt-oss tiny-gpt-oss-b tiny-gemma4 tiny-gemma4-text; do
  for be in cpu cuda; do
    "$bin/mxserve" generate --model "$MX_FIXTURES_DIR/$fx" --backend $be --prompt-ids 1,2,3,4,5,6,7,8,9 \
      --max-new-tokens 24 >"$OUT/generate_${fx}_$be.jsonl" 2>>"$log" || cli_fail=1
  done
  if cmp -s "$OUT/generate_${fx}_cpu.jsonl" "$OUT/generate_${fx}_cuda.jsonl"; then same=identical; else same=DIFFERENT; fi
  echo "mxserve generate $fx: cpu vs cuda greedy tokens $same" | tee -a "$log"
  head -c 400 "$OUT/generate_${fx}_cuda.jsonl" | tee -a "$log"
done
echo "mx_gpu_tests exit $status, mxserve generate failures $cli_fail" | tee -a "$log"
exit $((status != 0 || cli_fail != 0))
