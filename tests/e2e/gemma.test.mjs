// Gemma-4 through the OpenAI client: `mxserve serve --model` on the gemma-demo preset (random weights, a
// Gemma-4 tokenizer) picks the gemma4 chat format from config.json. Scripted outputs (`--test-forced-tokens`)
// travel the real engine, parser and formatters: thinking -> reasoning, tool calls -> tool_calls with JSON
// arguments, streamed and not; reasoning on and off by reasoning_effort and chat_template_kwargs; a sampled
// answer from the random model; the tool result round trip; structured outputs and tool_choice on the
// random model, validated by npm ajv.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

import { startServer, removeScratch, mxserveBinary } from './lib/server.mjs';

let OpenAI;
let Ajv;
try {
  ({ default: OpenAI } = await import('openai'));
  ({ default: Ajv } = await import('ajv'));
} catch (e) {
  throw new Error(`the openai / ajv npm packages are missing from tests/e2e/node_modules: run scripts/bootstrap (${e.message})`);
}

const Q = '<|"|>';
const transcripts = {
  'FORCE-TOOL': `<|channel>thought\nThe user wants the weather in Paris.\n<channel|>` +
    `<|tool_call>call:get_weather{city:${Q}Paris${Q},days:[1,2],metric:true}<tool_call|><|tool_response>`,
  'FORCE-THINK': '<|channel>thought\nJust greet them.\n<channel|>Hello, world! ¿Qué tal? 👋<turn|>',
  'FORCE-ANSWER': 'It is 21 degrees in Paris.<turn|>',
  'FORCE-BROKEN': `Sure. <|tool_call>call:get_weather{city:${Q}Par<turn|>`,
};
const TOOL_ARGS = '{"city":"Paris","days":[1,2],"metric":true}';

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Current weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

let server;
let client;
let scratch;
let model;

before(async () => {
  scratch = mkdtempSync(path.join(tmpdir(), 'mx-e2e-gemma-'));
  const dir = path.join(scratch, 'gemma-demo');
  const made = spawnSync(mxserveBinary(), ['make-model', '--preset', 'gemma-demo', '--out', dir, '--threads', '2'], { encoding: 'utf8' });
  assert.equal(made.status, 0, `make-model failed: ${made.stderr}`);
  const file = path.join(scratch, 'transcripts.json');
  writeFileSync(file, JSON.stringify({ transcripts: Object.entries(transcripts).map(([match, text]) => ({ match, text })) }));
  server = await startServer({ args: ['--model', dir, '--threads', '2', '--test-forced-tokens', file] });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });
  model = (await client.models.list()).data[0].id;
});

after(async () => {
  if (!server) return;
  const { code, signal } = await server.stop();
  removeScratch();
  rmSync(scratch, { recursive: true, force: true });
  assert.equal(code, 0, `mxserve exit: code ${code}, signal ${signal}\n${server.stderr()}`);
});

async function chatBoth(params) {
  const whole = await client.chat.completions.create({ model, max_tokens: 200, ...params });
  const s = { content: '', reasoning: '', calls: [], finish: null };
  for await (const chunk of await client.chat.completions.create({ model, max_tokens: 200, ...params, stream: true })) {
    for (const c of chunk.choices) {
      s.content += c.delta.content ?? '';
      s.reasoning += c.delta.reasoning ?? '';
      for (const d of c.delta.tool_calls ?? []) {
        if (d.id) s.calls[d.index] = { name: d.function.name, arguments: '' };
        s.calls[d.index].arguments += d.function?.arguments ?? '';
      }
      if (c.finish_reason) s.finish = c.finish_reason;
    }
  }
  return { whole, streamed: s };
}

const ask = (text) => [{ role: 'user', content: text }];

test('thinking then a tool call -> reasoning + tool_calls with JSON arguments, finish tool_calls', async () => {
  const { whole, streamed } = await chatBoth({ messages: ask('Weather? FORCE-TOOL'), tools, chat_template_kwargs: { enable_thinking: true } });
  const c = whole.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.content, null);
  assert.equal(c.message.reasoning, 'The user wants the weather in Paris.');
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
  assert.equal(c.message.tool_calls[0].function.arguments, TOOL_ARGS);
  assert.equal(streamed.finish, 'tool_calls');
  assert.equal(streamed.reasoning, c.message.reasoning);
  assert.deepEqual(streamed.calls, [{ name: 'get_weather', arguments: TOOL_ARGS }]);
});

test('reasoning on by reasoning_effort: reasoning + content, finish stop', async () => {
  const { whole, streamed } = await chatBoth({ messages: ask('Hi FORCE-THINK'), reasoning_effort: 'high' });
  const c = whole.choices[0];
  assert.equal(c.finish_reason, 'stop');
  assert.equal(c.message.reasoning, 'Just greet them.');
  assert.equal(c.message.content, 'Hello, world! ¿Qué tal? 👋');
  assert.equal(streamed.reasoning, c.message.reasoning);
  assert.equal(streamed.content, c.message.content);
  assert.ok(whole.usage.completion_tokens_details.reasoning_tokens > 0);
});

test('reasoning on and off changes the prompt the model sees', async () => {
  const usage = async (extra) => (await client.chat.completions.create({ model, messages: ask('FORCE-ANSWER'), ...extra })).usage.prompt_tokens;
  const off = await usage({});
  assert.equal(await usage({ reasoning_effort: 'none' }), off);
  assert.equal(await usage({ chat_template_kwargs: { enable_thinking: false } }), off);
  const on = await usage({ chat_template_kwargs: { enable_thinking: true } });
  assert.notEqual(on, off);  // a system turn with <|think|> instead of the empty thought channel
  assert.equal(await usage({ reasoning_effort: 'low' }), on);
  assert.equal(await usage({ reasoning_effort: 'high', chat_template_kwargs: { enable_thinking: false } }), off);
});

test('the tool result goes back and the turn is answered', async () => {
  const first = await client.chat.completions.create({ model, messages: ask('Weather? FORCE-TOOL'), tools });
  const call = first.choices[0].message.tool_calls[0];
  const second = await client.chat.completions.create({
    model, tools,
    messages: [
      { role: 'user', content: 'Weather? FORCE-ANSWER' },
      { role: 'assistant', content: null, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21}' },
    ],
  });
  assert.equal(second.choices[0].message.content, 'It is 21 degrees in Paris.');
  assert.equal(second.choices[0].finish_reason, 'stop');
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens);
});

test('a broken tool call is content, never an error', async () => {
  const { whole, streamed } = await chatBoth({ messages: ask('FORCE-BROKEN'), tools });
  const c = whole.choices[0];
  assert.ok(!c.message.tool_calls || c.message.tool_calls.length === 0);
  assert.equal(c.message.content, `Sure. <|tool_call>call:get_weather{city:${Q}Par`);
  assert.equal(streamed.content, c.message.content);
  assert.equal(c.finish_reason, 'stop');
});

test('the random-weight model samples an answer, streamed and not', async () => {
  const { whole, streamed } = await chatBoth({ messages: ask('Tell me a story.'), max_tokens: 6, seed: 7, temperature: 1 });
  assert.equal(whole.choices[0].finish_reason, 'length');
  assert.equal(whole.usage.completion_tokens, 6);
  const c = whole.choices[0].message;
  assert.equal(streamed.content + streamed.reasoning, (c.content ?? '') + (c.reasoning ?? ''));
});

// Structured outputs through the gemma4 format's constraint (chat/gemma4/gemma4_constraint.h) on the
// random-weight model: left alone it never writes valid JSON or a call, so every valid one is the masks'
// doing. The thought is free but bounded by thinking_token_budget (or half of max_tokens).
const weather = { type: 'object', properties: { city: { enum: ['Paris', 'Oslo', 'a "quoted" city'] },
  days: { type: 'integer', minimum: 1, maximum: 7 }, note: { type: 'string', maxLength: 6 },
  hourly: { type: 'array', items: { type: 'boolean' }, maxItems: 2 } },
  required: ['city', 'days', 'note', 'hourly'], additionalProperties: false };
const clock = { type: 'object', properties: { zone: { type: 'string', pattern: '^[A-Z]{3}$' } }, required: ['zone'] };
const twoTools = [
  { type: 'function', function: { name: 'get_weather', parameters: weather } },
  { type: 'function', function: { name: 'get_time', parameters: clock } },
];

// The choices of one request through the SDK, streamed or not: content, reasoning, calls, finish reason.
async function choicesOf(body) {
  if (!body.stream) {
    const r = await client.chat.completions.create({ model, ...body });
    return r.choices.map((c) => ({ content: c.message.content ?? '', reasoning: c.message.reasoning_content ?? '',
      calls: c.message.tool_calls ?? [], finish: c.finish_reason }));
  }
  const out = [];
  for await (const chunk of await client.chat.completions.create({ model, ...body })) {
    for (const c of chunk.choices) {
      const o = (out[c.index] ??= { content: '', reasoning: '', calls: [], finish: null });
      o.content += c.delta?.content ?? '';
      o.reasoning += c.delta?.reasoning_content ?? '';
      for (const t of c.delta?.tool_calls ?? []) {
        o.calls[t.index] ??= { function: { name: '', arguments: '' } };
        o.calls[t.index].function.name += t.function?.name ?? '';
        o.calls[t.index].function.arguments += t.function?.arguments ?? '';
      }
      if (c.finish_reason) o.finish = c.finish_reason;
    }
  }
  return out;
}

test('response_format on Gemma-4: every answer finishes and validates, thinking on and off, streamed and not', async (t) => {
  const ajv = new Ajv({ strict: false });
  const validate = ajv.compile(weather);
  let thoughts = 0;
  for (const thinking of [true, false]) {
    for (const stream of [false, true]) {
      const choices = await choicesOf({ messages: ask('weather as JSON'), n: 4, seed: thinking ? 5 : 6, max_tokens: 200,
        stream, thinking_token_budget: 6, chat_template_kwargs: { enable_thinking: thinking },
        response_format: { type: 'json_schema', json_schema: { name: 'w', strict: true, schema: weather } } });
      assert.equal(choices.length, 4);
      for (const c of choices) {
        assert.equal(c.finish, 'stop', JSON.stringify(c));
        assert.deepEqual(c.calls, []);
        assert.ok(validate(JSON.parse(c.content)), `${c.content} ${JSON.stringify(validate.errors)}`);
        if (!thinking) assert.equal(c.reasoning, '');
        if (c.reasoning) thoughts++;
      }
      t.diagnostic(`thinking ${thinking}, stream ${stream}: ${JSON.stringify(choices[0])}`);
    }
  }
  assert.ok(thoughts > 0, 'no choice used its thought');
});

test('tool_choice on Gemma-4: required always calls with valid arguments, named always that tool', async (t) => {
  const ajv = new Ajv({ strict: false });
  const check = { get_weather: ajv.compile(weather), get_time: ajv.compile(clock) };
  const names = new Set();
  for (const [kind, toolChoice] of [['required', 'required'], ['named', { type: 'function', function: { name: 'get_time' } }]]) {
    for (const stream of [false, true]) {
      const choices = await choicesOf({ messages: ask(`plan ${kind}`), n: 4, seed: 9, max_tokens: 160, stream,
        tools: twoTools, tool_choice: toolChoice, parallel_tool_calls: false, reasoning_effort: 'high' });
      for (const c of choices) {
        assert.equal(c.finish, 'tool_calls', JSON.stringify(c));
        assert.equal(c.calls.length, 1, JSON.stringify(c));
        const fn = c.calls[0].function;
        if (kind === 'named') assert.equal(fn.name, 'get_time');
        names.add(fn.name);
        assert.ok(check[fn.name](JSON.parse(fn.arguments)), `${fn.name}: ${fn.arguments}`);
      }
      t.diagnostic(`${kind}, stream ${stream}: ${JSON.stringify(choices[0])}`);
    }
  }
  assert.ok(names.has('get_weather'), 'required never picked get_weather');
});

test('unsupported schemas on Gemma-4 are 400s naming the field', async () => {
  await assert.rejects(
    client.chat.completions.create({ model, messages: ask('x'), tool_choice: 'required', tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', propertyNames: {} } } }] }),
    (e) => e.status === 400 && e.param === 'tools[0].function.parameters');
});
