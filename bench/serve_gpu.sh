#!/usr/bin/env bash
# One GPU-machine run of the serving table (docs/PERF.md) for each given preset, from prebuilt binaries
# (make gpu-bundle) in this script's folder: make the synthetic checkpoint in /dev/shm (the device disk is
# too small for 120b), time start-up to the first served token, then bench/serve_table.sh at 1K/1K.
#
# usage: bench/serve_gpu.sh PRESET[:FACTOR[:CONCURRENCIES]] ...   e.g. gpt-oss-20b:3 "gpt-oss-120b:2:1 8 64"
# env:   OUT (logs and JSON), MX_COMMIT (recorded), SERVE_FLAGS (extra `mxserve serve` flags; default none:
#        the KV pool comes from --mem-fraction's plan), TABLE_TIMEOUT (seconds per table, default 400)
# Writes $OUT/<preset>-summary.txt (GPU, start-up, exit codes) and $OUT/<preset>-table.tgz (reports + JSON).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/mx-serve-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ! ls /usr/local/cuda/lib64/libcublasLt.so.13 >/dev/null 2>&1; then
  lt=$(find / -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)
  [[ -n $lt ]] && export LD_LIBRARY_PATH=$(dirname "$lt"):$LD_LIBRARY_PATH
fi
read -r -a flags <<<"${SERVE_FLAGS:-}"
tiktoken=$here/o200k_base.tiktoken
[ -f "$tiktoken" ] || tiktoken=$here/../tests/fixtures/tokenizer/o200k_base.tiktoken

for spec in "$@"; do
  IFS=: read -r preset factor concurrencies <<<"$spec"
  log=$OUT/$preset-summary.txt
  { echo "commit ${MX_COMMIT:-?} preset $preset flags ${flags[*]:-(none)}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } >"$log"
  model=/dev/shm/$preset
  TIMEFORMAT="make-model %R s"
  { time "$here/mxserve" make-model --preset "$preset" --out "$model" --threads 16; } >>"$log" 2>&1
  [ -f "$model/tokenizer.json" ] || cp "$tiktoken" "$model/"  # gpt-oss presets come without a tokenizer
  t0=$(date +%s.%N)
  "$here/mxserve" serve --model "$model" --backend cuda --port 8100 "${flags[@]}" >"$OUT/$preset-startup.log" 2>&1 &
  pid=$!
  until curl -sf -o /dev/null localhost:8100/health; do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  t1=$(date +%s.%N)
  curl -s localhost:8100/v1/completions -H 'Content-Type: application/json' \
    -d "{\"model\":\"$preset\",\"prompt\":\"Hello\",\"max_tokens\":1}" >>"$log"
  t2=$(date +%s.%N)
  echo >>"$log"
  echo "start-up: ready after $(python3 -c "print(round($t1 - $t0, 2))") s, first token served after $(python3 -c "print(round($t2 - $t0, 2))") s" >>"$log"
  kill -TERM $pid; wait $pid
  table=/tmp/table-$preset
  mkdir -p "$table"
  CONCURRENCIES=${concurrencies:-1 8 64 256} FACTOR=${factor:-3} PORT=8101 timeout "${TABLE_TIMEOUT:-400}" \
    bash "$here/serve_table.sh" "$here/mxserve" "$model" "$table" "${flags[@]}" >>"$log" 2>&1
  echo "serve_table exit $?" >>"$log"
  grep -E "KV|plan|graphs" "$table/serve.log" | head -20 >>"$log"
  tar czf "$OUT/$preset-table.tgz" -C /tmp "table-$preset"
  rm -rf "$model"
  cat "$log"
done
