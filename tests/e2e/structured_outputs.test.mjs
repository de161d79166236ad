// Structured outputs on the demo model (random weights: left alone it writes noise, so every valid answer
// is the token masks' doing), checked by an independent validator (npm ajv + ajv-formats). A seeded corpus
// of 60 schemas (nested objects, enums, bounded integers and numbers, maxLength strings, patterns, formats,
// bounded arrays, anyOf, optional properties, recursive $ref), each asked with n choices, streamed for half
// of them and not for the rest, plus 40 tool_choice requests. n is 2 in `make test` (160 engine requests: CI's
// 20 minutes on 2 cores); MX_E2E_STRUCTURED_N=4 doubles the sampled answers per schema;
// MX_E2E_STRUCTURED_N=16 runs the full check (1,000 engine requests; ~280 s on 2 cores, near ctest's 300 s limit:
// run it with node directly when the machine is loaded). The analysis is free but bounded
// (thinking_token_budget, or half of max_tokens by default), so every choice reaches its answer: each one
// of a schema whose values are all bounded must end with `stop` and validate; the recursive schema may be
// cut by max_tokens, and then holds a prefix of JSON.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';

import { startServer, removeScratch } from './lib/server.mjs';

let Ajv;
let addFormats;
try {
  ({ default: Ajv } = await import('ajv'));
  ({ default: addFormats } = await import('ajv-formats'));
} catch (e) {
  throw new Error(`ajv / ajv-formats are missing from tests/e2e/node_modules: run scripts/bootstrap (${e.message})`);
}

const N = Number(process.env.MX_E2E_STRUCTURED_N ?? 2);
let server;

before(async () => {
  server = await startServer({ args: ['--max-running-requests', '64'] });
});

after(async () => {
  if (!server) return;
  const { code } = await server.stop();
  removeScratch();
  assert.equal(code, 0);
});

// A seeded linear congruential generator: the corpus is the same on every run.
function rng(seed) {
  let s = seed >>> 0;
  return () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296;
}

const leaves = [
  () => ({ type: 'integer', minimum: 0, maximum: 150 }),
  () => ({ type: 'integer', minimum: -40, maximum: 40 }),
  () => ({ type: 'number', minimum: 0, maximum: 10 }),
  () => ({ type: 'boolean' }),
  () => ({ type: 'null' }),
  () => ({ enum: ['red', 'green', 'blue', 'a "quoted" one'] }),
  () => ({ const: 'fixed' }),
  () => ({ type: 'string', maxLength: 8 }),
  () => ({ type: 'string', minLength: 2, maxLength: 5 }),
  () => ({ type: 'string', pattern: '^[A-Z]{2}-[0-9]{3}$' }),
  () => ({ type: 'string', format: 'date' }),
  () => ({ type: 'string', format: 'uuid' }),
  () => ({ type: 'string', format: 'ipv4' }),
  () => ({ type: 'string', format: 'time' }),
  () => ({ anyOf: [{ type: 'integer', minimum: 1, maximum: 9 }, { type: 'null' }] }),
  () => ({ type: ['boolean', 'null'] }),
  () => ({ type: 'array', items: { enum: ['x', 'y'] }, maxItems: 3 }),
  () => ({ type: 'array', items: { type: 'integer', minimum: 0, maximum: 9 }, minItems: 1, maxItems: 2 }),
];

function objectSchema(r, depth, strict) {
  const props = {};
  const count = 1 + Math.floor(r() * 3);
  for (let i = 0; i < count; i++) {
    const nest = depth < 2 && r() < 0.25;
    props[`f${i}`] = nest ? objectSchema(r, depth + 1, strict) : leaves[Math.floor(r() * leaves.length)]();
  }
  const names = Object.keys(props);
  const required = strict ? names : names.filter(() => r() < 0.5);
  return { type: 'object', properties: props, required, additionalProperties: false };
}

function corpus() {
  const r = rng(17);
  const schemas = [];
  for (let i = 0; i < 56; i++) schemas.push(objectSchema(r, 0, i % 2 === 0));
  schemas.push({
    $defs: { node: { type: 'object', properties: { v: { type: 'integer', minimum: 0, maximum: 9 },
      kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } }, required: ['v', 'kids'] } },
    $ref: '#/$defs/node',
  });
  schemas.push({ type: 'array', items: { type: 'string', maxLength: 3 }, maxItems: 4 });
  schemas.push({ anyOf: [objectSchema(r, 0, true), { type: 'string', maxLength: 4 }] });
  schemas.push({ type: 'object', properties: { when: { type: 'string', format: 'date-time' },
    mail: { type: 'string', format: 'email' } }, required: ['when', 'mail'] });
  return schemas;
}

// The choices of one chat request: content and finish reason each, streamed or not.
async function ask(body) {
  const res = await fetch(`${server.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  const text = await res.text();
  assert.equal(res.status, 200, text);
  if (!body.stream) {
    return JSON.parse(text).choices.map((c) => ({ content: c.message.content ?? '', finish: c.finish_reason,
      calls: c.message.tool_calls ?? [], reasoning: c.message.reasoning_content ?? '' }));
  }
  const out = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    for (const c of JSON.parse(line.slice(6)).choices) {
      const o = (out[c.index] ??= { content: '', finish: null, calls: [], reasoning: '' });
      if (typeof c.delta?.content === 'string') o.content += c.delta.content;
      if (typeof c.delta?.reasoning_content === 'string') o.reasoning += c.delta.reasoning_content;
      for (const t of c.delta?.tool_calls ?? []) {
        o.calls[t.index] ??= { function: { name: t.function?.name ?? '', arguments: '' } };
        o.calls[t.index].function.arguments += t.function?.arguments ?? '';
      }
      if (c.finish_reason) o.finish = c.finish_reason;
    }
  }
  return out;
}

// A prefix of some JSON text (as the grammar writes it: no whitespace but one space after ',' and ':'):
// a small pushdown check, character by character, that some completion could still parse.
function isJsonPrefix(s) {
  const stack = [];  // '{' or '['
  let expect = 'value';  // value | key | colon | comma_or_close | done
  let i = 0;
  const literal = (word) => {
    const part = s.slice(i, i + word.length);
    if (!word.startsWith(part)) return false;
    i += part.length;
    return true;
  };
  const afterValue = () => { expect = stack.length ? 'comma_or_close' : 'done'; };
  while (i < s.length) {
    const ch = s[i];
    if (ch === ' ' && (s[i - 1] === ',' || s[i - 1] === ':')) { i++; continue; }
    if (expect === 'done') return false;
    if (expect === 'colon') {
      if (ch !== ':') return false;
      i++;
      expect = 'value';
    } else if (expect === 'comma_or_close') {
      if (ch === ',') { i++; expect = stack[stack.length - 1] === '{' ? 'key' : 'value'; continue; }
      if ((ch === '}' && stack.at(-1) === '{') || (ch === ']' && stack.at(-1) === '[')) { stack.pop(); i++; afterValue(); continue; }
      return false;
    } else if (ch === '"') {  // a string (value or key)
      const wasKey = expect === 'key';
      i++;
      while (i < s.length && s[i] !== '"') i += s[i] === '\\' ? 2 : 1;
      if (i >= s.length) return true;
      i++;
      if (wasKey) expect = 'colon'; else afterValue();
    } else if (expect === 'key') {
      if (ch === '}' && s[i - 1] === '{') { stack.pop(); i++; afterValue(); continue; }
      return false;
    } else if (ch === '{' || ch === '[') {
      stack.push(ch);
      i++;
      expect = ch === '{' ? 'key' : 'value';
    } else if (ch === ']' && s[i - 1] === '[') {
      stack.pop();
      i++;
      afterValue();
    } else if (/[-0-9]/.test(ch)) {
      const m = /^-?(0|[1-9][0-9]*)?(\.[0-9]*)?([eE][+-]?[0-9]*)?/.exec(s.slice(i));
      i += m[0].length;
      if (i < s.length) afterValue();
    } else if (!literal('true') && !literal('false') && !literal('null')) {
      return false;
    } else if (i <= s.length) {
      afterValue();
    }
  }
  return true;
}

// Every value of the schema has a bounded length (no recursion, no unbounded string, array or number).
function bounded(schema) {
  return !JSON.stringify(schema).includes('$ref');
}

test('every answer that finishes validates against its schema (60 schemas x n choices)', async (t) => {
  const ajv = new Ajv({ strict: false, allErrors: true });
  addFormats(ajv);
  const schemas = corpus();
  let finished = 0;
  let total = 0;
  await Promise.all(schemas.map(async (schema, i) => {
    const validate = ajv.compile(schema);
    const choices = await ask({
      messages: [{ role: 'user', content: `Give me item ${i}` }], n: N, seed: 1000 + i, max_tokens: 320,
      thinking_token_budget: 4,
      stream: i % 2 === 1, response_format: { type: 'json_schema', json_schema: { name: `s${i}`, strict: true, schema } },
    });
    assert.equal(choices.length, N);
    for (const c of choices) {
      total++;
      if (c.finish === 'stop') {
        finished++;
        const value = JSON.parse(c.content);
        assert.ok(validate(value), `schema ${i}: ${c.content}\n${JSON.stringify(validate.errors)}\n${JSON.stringify(schema)}`);
      } else {
        assert.ok(!bounded(schema), `schema ${i} is bounded and did not finish: ${c.finish} ${c.content}`);
        assert.equal(c.finish, 'length', `schema ${i}`);
        assert.ok(isJsonPrefix(c.content), `schema ${i}: ${c.content}`);
      }
    }
  }));
  t.diagnostic(`${finished} of ${total} choices finished; all validated`);
  assert.equal(total, 60 * N);
});

test('tool_choice required and named always call a tool with valid arguments', async () => {
  const ajv = new Ajv({ strict: false });
  const weather = { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] },
    days: { type: 'integer', minimum: 1, maximum: 7 } }, required: ['city', 'days'], additionalProperties: false };
  const time = { type: 'object', properties: { zone: { type: 'string', maxLength: 4 } }, required: ['zone'] };
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: weather } },
    { type: 'function', function: { name: 'get_time', parameters: time } }];
  const check = { get_weather: ajv.compile(weather), get_time: ajv.compile(time) };
  let calls = 0;
  for (const [k, toolChoice] of [['required', 'required'], ['named', { type: 'function', function: { name: 'get_time' } }]]) {
    for (const stream of [false, true]) {
      // No thinking_token_budget: the analysis may take half of max_tokens, the call the rest.
      const choices = await ask({ messages: [{ role: 'user', content: `Plan ${k}` }], tools, tool_choice: toolChoice,
        n: 10, seed: 7, max_tokens: 128, stream });
      for (const c of choices) {
        calls++;
        assert.equal(c.finish, 'tool_calls', JSON.stringify(c));
        assert.equal(c.content, '');
        const fn = c.calls[0].function;
        if (k === 'named') assert.equal(fn.name, 'get_time');
        assert.ok(check[fn.name](JSON.parse(fn.arguments)), `${fn.name}: ${fn.arguments}`);
      }
    }
  }
  assert.equal(calls, 40);
});

test('answers cut by max_tokens are prefixes of valid JSON', async () => {
  const schemas = corpus();
  let cut = 0;
  await Promise.all(schemas.slice(0, 12).map(async (schema, i) => {
    const choices = await ask({ messages: [{ role: 'user', content: `Cut ${i}` }], n: 2, seed: 50 + i, max_tokens: 14,
      thinking_token_budget: 0, response_format: { type: 'json_schema', json_schema: { name: `c${i}`, schema } } });
    for (const c of choices) {
      if (c.finish !== 'length') continue;
      cut++;
      assert.equal(c.reasoning, '');
      assert.ok(isJsonPrefix(c.content), `schema ${i}: ${c.content}`);
    }
  }));
  assert.ok(cut >= 12, `only ${cut} choices were cut`);
  for (const bad of ['{"a":1}}', '{"a" 1', '[1,,2', '{,', 'nul1', '{"a":tru e']) assert.ok(!isJsonPrefix(bad), bad);
  for (const good of ['{"a": [1, {"b":', '"x\\"y', '-0.5', '[tr', '{}']) assert.ok(isJsonPrefix(good), good);
});

test('unconstrained requests sample the same tokens beside constrained ones', async () => {
  const plain = { messages: [{ role: 'user', content: 'Free text please' }], n: 2, seed: 4242, max_tokens: 24 };
  const alone = await ask(plain);
  const schema = corpus()[0];
  const [beside] = await Promise.all([ask(plain), ...[0, 1, 2].map((k) => ask({
    messages: [{ role: 'user', content: `Busy ${k}` }], n: 2, seed: k, max_tokens: 40, thinking_token_budget: 4,
    response_format: { type: 'json_schema', json_schema: { name: 'b', schema } } }))]);
  assert.deepEqual(beside, alone);
  assert.ok(alone.some((c) => c.reasoning.length > 0 || c.content.length > 0));
});

test('unsupported schemas are 400s naming the keyword', async () => {
  const res = await fetch(`${server.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', propertyNames: {} } } } }),
  });
  assert.equal(res.status, 400);
  const body = await res.json();
  assert.match(body.error.message, /propertyNames/);
  assert.equal(body.error.param, 'response_format.json_schema.schema');
});
