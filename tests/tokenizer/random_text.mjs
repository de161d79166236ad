// Seeded random text that stresses the o200k pre-tokenizer and BPE: many scripts, emoji with skin-tone
// modifiers and ZWJ, combining marks, digits of several systems, punctuation, runs of spaces, tabs and
// line breaks. Shared by the differential test and the benchmark.
//
// Code points whose treatment can differ between the peers' regex engines are left out on purpose:
// U+0085 and U+FEFF (JavaScript's \s and Unicode White_Space disagree on them), U+180E, U+017F (it case-folds
// to "s", and js-tiktoken spells out (?i:'s) as 's|'S), and characters assigned after Unicode 10.

export function makeRng(seed) {
  // mulberry32: small, fast, and the same sequence on every machine for a given seed.
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const range = (lo, hi) => {
  const out = [];
  for (let c = lo; c <= hi; c++) out.push(String.fromCodePoint(c));
  return out;
};

const pools = {
  latinLower: range(0x61, 0x7a),
  latinUpper: range(0x41, 0x5a),
  latinAccented: [..."éèêëàâäçñßøåæœíóúüÉÀÇÑØÅÆŒİıŁłŠšŽž"],
  cyrillic: range(0x410, 0x44f),
  greek: [...range(0x391, 0x3a1), ...range(0x3a3, 0x3a9), ...range(0x3b1, 0x3c9)],
  cjk: range(0x4e00, 0x9fa5),
  kana: [...range(0x3041, 0x3096), ...range(0x30a1, 0x30fa)],
  hangul: range(0xac00, 0xd7a3),
  arabic: range(0x621, 0x64a),
  arabicMarks: range(0x64b, 0x652),
  hebrew: range(0x5d0, 0x5ea),
  devanagari: range(0x905, 0x939),
  devanagariMarks: [...range(0x93e, 0x94d), "\u0902", "\u0903"],
  thai: range(0xe01, 0xe30),
  combining: range(0x300, 0x36f),
  digits: range(0x30, 0x39),
  otherDigits: [...range(0x660, 0x669), ...range(0x966, 0x96f), ...range(0xff10, 0xff19), "²", "³", "½", "Ⅻ", "①"],
  punct: [..."!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"],
  unicodePunct: [..."“”‘’—–…«»¿¡、。・「」『』【】《》،؛؟।॥§¶†‡•€£¥©®™°±×÷"],
  spaces: [" ", " ", " ", " ", "\t", "\u00a0", "\u3000", "\u2003", "\u000b", "\u000c"],
  breaks: ["\n", "\n", "\r\n", "\r", "\n\n"],
  emoji: [...range(0x1f600, 0x1f64f), ...range(0x1f300, 0x1f3fa), "❤", "☀", "⚽", "✨"],
  skinTones: range(0x1f3fb, 0x1f3ff),
  people: ["👨", "👩", "👧", "👦", "🧑"],
  regional: range(0x1f1e6, 0x1f1ff),
};

const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "'x"];

export function randomText(rng, maxSegments = 12) {
  const pick = (arr) => arr[Math.floor(rng() * arr.length)];
  const int = (lo, hi) => lo + Math.floor(rng() * (hi - lo + 1));
  const run = (pool, lo, hi) => {
    let s = "";
    for (let n = int(lo, hi); n > 0; n--) s += pick(pool);
    return s;
  };
  const segments = [
    () => run(pools.latinLower, 1, 10),
    () => pick(pools.latinUpper) + run(pools.latinLower, 0, 8),
    () => run(pools.latinUpper, 1, 6),
    () => run([...pools.latinLower, ...pools.latinAccented], 1, 9),
    () => run(pools.latinLower, 1, 6) + pick(contractions),
    () => run(pools.latinUpper, 1, 4) + pick(contractions),
    () => run(pools.cyrillic, 1, 10),
    () => run(pools.greek, 1, 8),
    () => run(pools.cjk, 1, 8),
    () => run(pools.kana, 1, 8),
    () => run(pools.hangul, 1, 5),
    () => {
      let s = "";
      for (let n = int(1, 8); n > 0; n--) s += pick(pools.arabic) + (rng() < 0.3 ? pick(pools.arabicMarks) : "");
      return s;
    },
    () => run(pools.hebrew, 1, 6),
    () => {
      let s = "";
      for (let n = int(1, 6); n > 0; n--) s += pick(pools.devanagari) + (rng() < 0.5 ? pick(pools.devanagariMarks) : "");
      return s;
    },
    () => run(pools.thai, 1, 8),
    () => pick(pools.latinLower) + run(pools.combining, 1, 3),
    () => run(pools.combining, 1, 2),
    () => run(pools.digits, 1, 9),
    () => run(pools.otherDigits, 1, 5),
    () => run(pools.digits, 1, 3) + pick([".", ",", ":", "/", "-"]) + run(pools.digits, 1, 4),
    () => run(pools.punct, 1, 4),
    () => run(pools.unicodePunct, 1, 3),
    () => run(pools.spaces, 1, 6),
    () => " ".repeat(int(1, 20)),
    () => run(pools.breaks, 1, 3),
    () => run(["\t", " "], 1, 5) + pick(pools.breaks),
    () => pick(pools.emoji) + (rng() < 0.4 ? pick(pools.skinTones) : "") + (rng() < 0.2 ? "\ufe0f" : ""),
    () => pick(pools.people) + (rng() < 0.5 ? pick(pools.skinTones) : "") + "\u200d" + pick(pools.people),
    () => "👨‍👩‍👧‍👦",
    () => pick(pools.regional) + pick(pools.regional),
    () => pick(pools.digits) + "\ufe0f\u20e3",
    () => " " + run(pools.latinLower, 1, 8),
    () => " " + run(pools.cjk, 1, 4),
    () => "<|" + run(pools.latinLower, 1, 6) + "|>",
  ];
  let s = "";
  const count = int(1, maxSegments);
  for (let i = 0; i < count; i++) s += rng() < 0.35 ? " " + pick(segments)() : pick(segments)();
  return s;
}
