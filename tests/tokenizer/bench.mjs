// Encode throughput, one thread: js-tiktoken vs mx_tokenizer_bench on the same 10 MB of seeded mixed text.
// usage: node bench.mjs --bench build/mx_tokenizer_bench --fixtures tests/fixtures/tokenizer [--mb 10]
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { Tiktoken } from "js-tiktoken/lite";
import o200k from "js-tiktoken/ranks/o200k_base";
import { makeRng, randomText } from "./random_text.mjs";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
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
const file = "/tmp/mx_tokenizer_bench.txt";
writeFileSync(file, text);

const enc = new Tiktoken(o200k);
enc.encode("warm up the JIT on a little text first");
const t0 = performance.now();
const jsTokens = enc.encode(text).length;
const jsSeconds = (performance.now() - t0) / 1000;

const r = spawnSync(args.bench, [`${args.fixtures}/o200k_base.tiktoken`, file], { encoding: "utf8" });
if (r.status !== 0) throw new Error(r.stderr);
const ours = JSON.parse(r.stdout);
const mb = Buffer.byteLength(text) / 1e6;
console.log(`text: ${mb.toFixed(1)} MB, js-tiktoken tokens ${jsTokens}, ours ${ours.tokens}`);
console.log(`js-tiktoken ${js(jsSeconds)}`);
console.log(`mxserve cold ${js(ours.cold_s)}, warm ${js(ours.warm_s)}`);
console.log(`speed-up (cold): ${(jsSeconds / ours.cold_s).toFixed(1)}x`);
function js(s) {
  return `${s.toFixed(3)} s = ${(mb / s).toFixed(2)} MB/s`;
}
