#!/usr/bin/env bash
# One GPU-machine run for issue 13 item 1 (MoE decode), from prebuilt binaries (make gpu-bundle) in this
# script's folder, everything in one process or one machine so that old and new compare on the same card:
#   tests     the MoE decode GPU tests: the stream kernels (moe_decode_stream.cu) against the CPU twin on odd
#             shapes, bitwise batch independence and graph replay; the ring kernels (moe_decode.cu)
#   variants  mx_kernel_bench --moe-decode-variants at 1-32 tokens: v1, ring and stream kernels, each GEMM alone
#   latency   make-model gpt-oss-20b to /dev/shm, then `bench latency --breakdown` at batch 1 and 8, 1K prompts,
#             the default path and --moe-stream-decode, alternated twice
#   ncu       Nsight Compute of the two stream GEMMs at 1 and 8 tokens (memory, warp stalls, issue slots)
# Usage: bench/moe_decode_gpu.sh [tests] [variants] [latency] [ncu]   (default: all). Logs and JSON go to $OUT,
# packed into $OUT/moe_decode.tgz after every step (a timeout still brings the finished steps back).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/mx-moe-decode-out}
R=/tmp/mx-moe-decode
mkdir -p "$OUT" "$R"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
if ! ls /usr/local/cuda/lib64/libcublasLt.so.13 >/dev/null 2>&1; then
  lt=$(find / -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)
  [[ -n $lt ]] && export LD_LIBRARY_PATH=$(dirname "$lt"):$LD_LIBRARY_PATH
fi
t0=$(date +%s)
save() { tar -C "$R" -czf "$OUT/moe_decode.tgz" .; }
stamp() { echo "$1 exit $2 at $(( $(date +%s) - t0 )) s" | tee -a "$R/steps.txt"; }
steps=${*:-tests variants latency ncu}
{
  echo "== $(date -u) commit ${MX_COMMIT:-unknown} steps: $steps"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
} >"$R/env.txt" 2>&1
if [[ $steps == *latency* ]]; then  # the 20b checkpoint is made while the other steps run
  ("$here/mxserve" make-model --preset gpt-oss-20b --out /dev/shm/20b --threads 12 >"$R/make_model.log" 2>&1
   echo "make-model exit $?" >>"$R/make_model.log") &
  maker=$!
fi
for step in $steps; do
  case $step in
    tests)
      MX_GPU_REPORT=$R/gpu_table.txt timeout 150 "$here/mx_gpu_tests" \
        --gtest_filter='KernelTest.MoeExpertsDecodeStream:KernelTest.MoeDecodeStreamGraphReplay:KernelTest.MoeDecodeIndependentOfBatch:KernelTest.MoeExpertsDecode' \
        >"$R/gpu_tests.log" 2>&1
      stamp tests $?
      grep -E "^\[  (PASSED|FAILED)|^\[  +FAILED \]" "$R/gpu_tests.log" | head -20 ;;
    variants)
      timeout 150 "$here/mx_kernel_bench" --moe-decode-variants=1,2,4,8,16,32 "$R/decode_variants.json" \
        >"$R/decode_variants.txt" 2>&1
      stamp variants $?
      grep "moe decode" "$R/decode_variants.txt" ;;
    latency)
      wait "$maker"; tail -1 "$R/make_model.log"
      args=(--model /dev/shm/20b --batch-size 1,8 --input-len 1024 --output-len 64 --breakdown)
      for run in 1 2; do
        for path in default stream; do
          extra=(); [[ $path == stream ]] && extra=(--moe-stream-decode)
          timeout 120 "$here/mxserve" bench latency "${args[@]}" "${extra[@]}" --json "$R/latency_${path}_$run.json" \
            >"$R/latency_${path}_$run.log" 2>&1
          stamp "latency $path $run" $?
          grep -E "^ *[0-9]+ +[0-9]" "$R/latency_${path}_$run.log" | tail -2
        done
      done ;;
    ncu)
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats
                --section LaunchStats --section Occupancy --section SourceCounters)
      for tokens in 1 8; do
        timeout 60 "$ncu" --clock-control none -k regex:moe_stream_gemm_kernel -c 2 "${sections[@]}" \
          "$here/mx_kernel_bench" --moe-decode-variants=$tokens --variants=stream >"$R/ncu_stream_$tokens.txt" 2>&1
        stamp "ncu T=$tokens" $?
        grep -E "Duration|DRAM Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Ipc A" \
          "$R/ncu_stream_$tokens.txt" | head -12
      done ;;
    *) echo "unknown step $step (tests, variants, latency, ncu)"; exit 2 ;;
  esac
  save
done
