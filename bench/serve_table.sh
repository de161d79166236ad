#!/usr/bin/env bash
# The serving table (docs/PERF.md): `mxserve serve` on a GPU, then `mxserve bench serve` with 1K-token random
# prompts and 1K output tokens (ignore_eos) at concurrency 1, 8, 64 and 256, 5x concurrency requests each
# (bench_serving's guidance for a steady state) and as many warm-up requests as the concurrency. Each
# concurrency draws its own prompts (seed = concurrency): with one seed for all, a level's prompts would
# begin with the previous level's, and the server's prefix cache would skip their prefill.
#
# usage: bench/serve_table.sh MXSERVE MODEL_DIR|demo|preset:NAME OUT_DIR [extra `mxserve serve` flags...]
#        preset:NAME serves a synthetic preset made in memory (`serve --preset`: no make-model) with the
#        tokenizer file TOKENIZER, which also draws the prompts
# env:   PORT (8000), BACKEND (cuda), CONCURRENCIES ("1 8 64 256"), FACTOR (5: requests per concurrency slot),
#        ISL (1024), OSL (1024), ENDPOINT (completions), TOKENIZER (with preset:NAME)
# Writes OUT_DIR/serve.log, and c<C>.txt (the report) and c<C>.json (everything) per concurrency, as each
# finishes, so a run cut short still leaves the rows it measured.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
bin=$1 model=$2 out=$3
shift 3
port=${PORT:-8000}
mkdir -p "$out"

model_flags=()
# The prompts are drawn with the model's tokenizer.json when its folder has one (Gemma-4: 1K tokens of o200k
# text are ~7K Gemma demo-tokenizer tokens), else with bench serve's built-in o200k.
prompt_tokenizer=()
case $model in
  demo) ;;
  preset:*)
    tokenizer=${TOKENIZER:?preset:NAME needs TOKENIZER, a tokenizer file}
    model_flags=(--preset "${model#preset:}" --tokenizer "$tokenizer")
    prompt_tokenizer=(--tokenizer "$tokenizer") ;;
  *)
    model_flags=(--model "$model")
    if [ -f "$model/tokenizer.json" ]; then prompt_tokenizer=(--tokenizer "$model"); fi ;;
esac
"$bin" serve "${model_flags[@]}" --backend "${BACKEND:-cuda}" --port "$port" "$@" >"$out/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT

# /health answers 200 once the model is loaded.
for _ in $(seq 1 900); do
  if ! kill -0 "$server" 2>/dev/null; then
    echo "serve_table: mxserve serve exited; see $out/serve.log" >&2
    tail -20 "$out/serve.log" >&2
    exit 1
  fi
  if curl -sf -o /dev/null "http://127.0.0.1:$port/health"; then break; fi
  sleep 1
done

for c in ${CONCURRENCIES:-1 8 64 256}; do
  n=$((c * ${FACTOR:-5}))
  echo "serve_table: concurrency $c, $n requests" >&2
  "$bin" bench serve --base-url "http://127.0.0.1:$port" --endpoint "${ENDPOINT:-completions}" \
    --random-input-len "${ISL:-1024}" --random-output-len "${OSL:-1024}" --max-concurrency "$c" \
    --num-prompts "$n" --warmup-requests "$c" --seed "$c" "${prompt_tokenizer[@]}" --json "$out/c$c.json" | tee "$out/c$c.txt"
done
