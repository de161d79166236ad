// Differential test: our tokenizer (through `mxserve tokenize`, from the .tiktoken file and from
// tokenizer.json.gz) against js-tiktoken's o200k_base on seeded random strings. Any mismatch fails and is
// printed with the seed, so `node diff_test.mjs ... --seed S` replays it.
//
// usage: node diff_test.mjs --mxserve PATH --fixtures DIR [--count N] [--seed S]
import { spawnSync } from "node:child_process";
import { makeRng, randomText } from "./random_text.mjs";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith("--") ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const count = Number(args.count ?? 20000);
const seed = Number(args.seed ?? Math.floor(Math.random() * 2 ** 31));
console.log(`tokenizer diff test: ${count} strings, seed ${seed} (replay with --seed ${seed})`);

let Tiktoken, o200k;
try {
  ({ Tiktoken } = await import("js-tiktoken/lite"));
  o200k = (await import("js-tiktoken/ranks/o200k_base")).default;
} catch (e) {
  console.log("SKIP: js-tiktoken is not installed (run scripts/bootstrap): " + e.message);
  process.exit(77);
}
const peer = new Tiktoken(o200k);

const rng = makeRng(seed);
const texts = [];
for (let i = 0; i < count; i++) texts.push(randomText(rng, i % 50 === 0 ? 60 : 12));

function runMxserve(extraArgs, lines) {
  const r = spawnSync(args.mxserve, ["tokenize", ...extraArgs], {
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

const input = texts.map((t) => JSON.stringify(t));
const t0 = performance.now();
const want = texts.map((t) => peer.encode(t));
const t1 = performance.now();
const fromTiktoken = runMxserve(["--tokenizer", `${args.fixtures}/o200k_base.tiktoken`], input);
const fromJson = runMxserve(["--tokenizer", `${args.fixtures}/gpt-oss.tokenizer.json.gz`], input);
const decoded = runMxserve(
  ["--tokenizer", `${args.fixtures}/o200k_base.tiktoken`, "--decode"],
  fromTiktoken.map((ids) => JSON.stringify(ids)),
);

let mismatches = 0;
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
for (let i = 0; i < count; i++) {
  const problems = [];
  if (!same(fromTiktoken[i], want[i])) problems.push(`.tiktoken ${JSON.stringify(fromTiktoken[i])}`);
  if (!same(fromJson[i], fromTiktoken[i])) problems.push(`tokenizer.json ${JSON.stringify(fromJson[i])}`);
  if (decoded[i] !== texts[i]) problems.push(`decode gave ${JSON.stringify(decoded[i])}`);
  if (problems.length && ++mismatches <= 10) {
    console.log(`MISMATCH #${i} ${JSON.stringify(texts[i])}\n  js-tiktoken ${JSON.stringify(want[i])}\n  ${problems.join("\n  ")}`);
  }
}
const chars = texts.reduce((n, t) => n + t.length, 0);
console.log(`${count} strings (${chars} UTF-16 units), js-tiktoken ${(t1 - t0).toFixed(0)} ms; mismatches: ${mismatches}; seed ${seed}`);
process.exit(mismatches === 0 ? 0 : 1);
