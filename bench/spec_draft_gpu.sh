#!/usr/bin/env bash
# One GPU-machine run for issue 16's draft models, from prebuilt binaries (make gpu-bundle), in the repository
# root of a checkout (fixtures from tests/fixtures). The steps named in STEPS (default: all; they run in the
# order listed here),
# each bounded by what is left of DEADLINE seconds (default 90; a step with under 8 s left is skipped and
# says so):
#   tests   the EAGLE-3 GPU tests (ops, drafter vs CPU) and SpeculationEqualsPlainDecodingOnCuda (all drafters)
#   forced  the plain decode step and the forced-acceptance verify step (k = 3) on gpt-oss-20b, batch 1, 8 and 32,
#           each timed op by op (--breakdown)
#   eagle3  bench latency --breakdown on the synthetic gpt-oss-20b with the synthetic gpt-oss-20b-eagle3 draft,
#           k = 3, batch 1 and 8: draft call ms (and one call timed op by op: the chain passes replay graphs,
#           a gap before the drafts' copy), verify step, mean accepted length, time per output token
#   eager   the same with --no-speculative-draft-graphs (every op of the call timed; a before/after pair with eagle3)
#   mtp     the same (without --breakdown) on the synthetic gemma-4-26b-a4b with its assistant preset
#   base    the eagle3 step (without --breakdown) with BASE's mxserve (a before/after pair from one machine)
# Usage: [STEPS="tests forced eagle3 eager"] bench/spec_draft_gpu.sh NEW_DIR [BASE_DIR]   (dirs holding
# mxserve and mx_gpu_tests). Logs to $OUT.
set -uo pipefail
new=$1 base=${2:-}
OUT=${OUT:-/tmp/mx-spec-draft-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
if ! ls /usr/local/cuda/lib64/libcublasLt.so.13 >/dev/null 2>&1; then
  lt=$(find / -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)
  [[ -n $lt ]] && export LD_LIBRARY_PATH=$(dirname "$lt"):$LD_LIBRARY_PATH
fi
export MX_FIXTURES_DIR=${MX_FIXTURES_DIR:-$(pwd)/tests/fixtures}
start=$(date +%s)
left() { echo $((${DEADLINE:-90} - ($(date +%s) - start))); }
steps=" ${STEPS:-tests forced eagle3 eager mtp base} "
step() {  # name, then the command
  local name=$1 l s
  shift
  [[ $steps == *" $name "* ]] || return 0
  l=$(left)
  if ((l < 8)); then echo "$name skipped (time)" >>"$OUT/steps.txt"; return; fi
  s=$(date +%s)
  timeout "$l" "$@" >"$OUT/$name.log" 2>&1
  echo "$name exit $? in $(($(date +%s) - s)) s" >>"$OUT/steps.txt"
}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >"$OUT/env.txt" 2>&1
"$new/mxserve" make-model --preset gpt-oss-20b-eagle3 --out /tmp/mx-eagle3 --threads 16 >"$OUT/make-models.log" 2>&1
[[ $steps == *" mtp "* ]] &&
  "$new/mxserve" make-model --preset gemma-4-26b-a4b-assistant --out /tmp/mx-assistant --threads 16 >>"$OUT/make-models.log" 2>&1
shape=(--threads 16 --batch-size 1,8 --input-len 128 --output-len 40)
eagle3=(--preset gpt-oss-20b "${shape[@]}" --speculative-algorithm eagle3 --speculative-num-draft-tokens 3
        --speculative-draft-model /tmp/mx-eagle3)
MX_GPU_REPORT=$OUT/gpu_table.txt step tests "$new/mx_gpu_tests" \
  --gtest_filter='Eagle3Gpu.*:*SpeculationEqualsPlainDecodingOnCuda*'
step forced "$new/mxserve" bench latency --preset gpt-oss-20b --threads 16 --batch-size 1,8,32 --input-len 128 \
  --output-len 48 --forced-acceptance 3 --breakdown --json "$OUT/forced.json"
step eagle3 "$new/mxserve" bench latency "${eagle3[@]}" --breakdown --json "$OUT/eagle3.json"
step eager "$new/mxserve" bench latency "${eagle3[@]}" --no-speculative-draft-graphs --breakdown --json "$OUT/eagle3-eager.json"
step mtp "$new/mxserve" bench latency --preset gemma-4-26b-a4b "${shape[@]}" --speculative-algorithm mtp \
  --speculative-num-draft-tokens 3 --speculative-draft-model /tmp/mx-assistant --json "$OUT/mtp.json"
[[ -n $base ]] && step base "$base/mxserve" bench latency "${eagle3[@]}" --json "$OUT/eagle3-base.json"
cat "$OUT/steps.txt"
for f in "$OUT"/*.log; do echo "== $f"; grep -v '^\[' "$f" | tail -n 14; done
