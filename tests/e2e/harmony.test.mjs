// gpt-oss's Harmony output as the OpenAI client sees it. The demo model has random weights, so the server
// runs with `--test-forced-tokens` (test only): for requests whose last user message holds a marker, the
// engine emits a scripted Harmony transcript instead of sampling, and that travels the real engine,
// parser, formatters and HTTP. Each transcript is checked streamed and not, in chat and in responses.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

import { startServer, removeScratch } from './lib/server.mjs';

let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch (e) {
  throw new Error(`the openai npm package is missing from tests/e2e/node_modules: run scripts/bootstrap (${e.message})`);
}

const TOOL_ARGS = '{"city":"Paris","unit":"celsius"}';
const transcripts = {
  'FORCE-TOOL':
    '<|channel|>analysis<|message|>The user wants the weather in Paris. I will call get_weather.<|end|>' +
    `<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>${TOOL_ARGS}<|call|>`,
  'FORCE-FINAL':
    '<|channel|>analysis<|message|>Just greet them.<|end|>' +
    '<|start|>assistant<|channel|>final<|message|>Hello, world! ¿Qué tal? 👋<|return|>',
  // Malformed: text after <|end|> that no header opened, then a stray <|return|>.
  'FORCE-STRAY':
    '<|channel|>analysis<|message|>Thinking hard.<|end|>Stray words<|return|>',
  // Tolerated: the call sits on the analysis channel, <|constrain|> is missing and <|call|> never comes.
  'FORCE-LOOSE':
    '<|channel|>analysis to=functions.get_weather json<|message|>{"city":"Rome"}',
};

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Current weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } }, required: ['city'] },
  },
}];
const flatTools = [{ type: 'function', ...tools[0].function }];

let server;
let client;
let scratch;

before(async () => {
  scratch = mkdtempSync(path.join(tmpdir(), 'mx-e2e-harmony-'));
  const file = path.join(scratch, 'transcripts.json');
  writeFileSync(file, JSON.stringify({ transcripts: Object.entries(transcripts).map(([match, text]) => ({ match, text })) }));
  server = await startServer({ args: ['--test-forced-tokens', file] });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
});

after(async () => {
  if (!server) return;
  const { code, signal } = await server.stop();
  removeScratch();
  rmSync(scratch, { recursive: true, force: true });
  assert.equal(code, 0, `mxserve exit: code ${code}, signal ${signal}\n${server.stderr()}`);
});

const check = test;

const ask = (marker) => [{ role: 'user', content: `What is the weather? ${marker}` }];

async function chatBoth(marker, extra = {}) {
  const params = { messages: ask(marker), tools, max_tokens: 200, ...extra };
  const whole = await client.chat.completions.create(params);
  const s = { role: 0, content: '', reasoning: '', reasoning_content: '', calls: [], finish: null, chunks: 0 };
  for await (const chunk of await client.chat.completions.create({ ...params, stream: true })) {
    ++s.chunks;
    for (const c of chunk.choices) {
      if (c.delta.role) ++s.role;
      s.content += c.delta.content ?? '';
      s.reasoning += c.delta.reasoning ?? '';
      s.reasoning_content += c.delta.reasoning_content ?? '';
      for (const d of c.delta.tool_calls ?? []) {
        if (d.id) s.calls[d.index] = { id: d.id, type: d.type, name: d.function.name, arguments: '' };
        assert.ok(s.calls[d.index], `arguments for call ${d.index} before its first fragment`);
        s.calls[d.index].arguments += d.function?.arguments ?? '';
      }
      if (c.finish_reason) s.finish = c.finish_reason;
    }
  }
  return { whole, streamed: s };
}

check('chat: analysis then a tool call -> reasoning + tool_calls, content null, finish tool_calls', async () => {
  const { whole, streamed } = await chatBoth('FORCE-TOOL');
  const c = whole.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.content, null);
  assert.equal(c.message.reasoning, 'The user wants the weather in Paris. I will call get_weather.');
  assert.equal(c.message.reasoning_content, c.message.reasoning);
  assert.equal(c.message.tool_calls.length, 1);
  const call = c.message.tool_calls[0];
  assert.match(call.id, /^call_/);
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.equal(call.function.arguments, TOOL_ARGS);
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', unit: 'celsius' });
  assert.ok(whole.usage.completion_tokens > 10);
  assert.ok(whole.usage.completion_tokens_details.reasoning_tokens > 0);

  assert.equal(streamed.finish, 'tool_calls');
  assert.equal(streamed.role, 1);
  assert.equal(streamed.content, '');
  assert.equal(streamed.reasoning, c.message.reasoning);
  assert.equal(streamed.reasoning_content, c.message.reasoning);
  assert.equal(streamed.calls.length, 1);
  assert.equal(streamed.calls[0].type, 'function');
  assert.equal(streamed.calls[0].name, 'get_weather');
  assert.equal(streamed.calls[0].arguments, TOOL_ARGS);
});

check('chat: analysis then final -> reasoning + content, finish stop, no tool_calls', async () => {
  const { whole, streamed } = await chatBoth('FORCE-FINAL');
  const c = whole.choices[0];
  assert.equal(c.finish_reason, 'stop');
  assert.equal(c.message.reasoning, 'Just greet them.');
  assert.equal(c.message.content, 'Hello, world! ¿Qué tal? 👋');
  assert.ok(!c.message.tool_calls || c.message.tool_calls.length === 0);
  assert.equal(streamed.finish, 'stop');
  assert.equal(streamed.reasoning, c.message.reasoning);
  assert.equal(streamed.content, c.message.content);
  assert.equal(streamed.calls.length, 0);
});

check('chat: logprobs cover the content tokens, streamed and not', async () => {
  const params = { messages: ask('FORCE-FINAL'), logprobs: true, top_logprobs: 3 };
  const r = await client.chat.completions.create(params);
  const entries = r.choices[0].logprobs.content;
  const bytes = Buffer.from(entries.flatMap((e) => e.bytes));
  // OpenAI: `bytes` is the token's raw UTF-8, so a character split across tokens (the emoji here) is
  // rebuilt by joining them; the decoded `token` text of such a piece may hold U+FFFD, `bytes` may not.
  assert.equal(bytes.toString('utf8'), r.choices[0].message.content, 'the joined `bytes` must spell the content');
  for (const e of entries) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 3);
  }
  const streamed = [];
  for await (const chunk of await client.chat.completions.create({ ...params, stream: true }))
    for (const c of chunk.choices) streamed.push(...(c.logprobs?.content ?? []));
  assert.deepEqual(streamed, entries);
});

check('chat: malformed Harmony never fails the request; nothing is lost', async () => {
  const { whole, streamed } = await chatBoth('FORCE-STRAY');
  const c = whole.choices[0];
  assert.equal(c.message.reasoning, 'Thinking hard.');
  assert.match(c.message.content ?? '', /Stray words/);
  assert.ok(!c.message.tool_calls || c.message.tool_calls.length === 0);
  assert.equal(c.finish_reason, 'stop');
  assert.equal(streamed.reasoning, c.message.reasoning);
  assert.equal(streamed.content, c.message.content);
  assert.equal(streamed.finish, c.finish_reason);
});

check('chat: a loose tool call (analysis channel, no <|constrain|>, no <|call|>) is still a tool call', async () => {
  const { whole, streamed } = await chatBoth('FORCE-LOOSE');
  const c = whole.choices[0];
  assert.equal(c.message.tool_calls?.length, 1, JSON.stringify(c.message));
  assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
  assert.equal(c.message.tool_calls[0].function.arguments, '{"city":"Rome"}');
  assert.equal(streamed.calls[0]?.arguments, '{"city":"Rome"}');
  assert.equal(streamed.finish, c.finish_reason);
});

check('chat: the tool result goes back and the next turn is answered', async () => {
  const first = await client.chat.completions.create({ messages: ask('FORCE-TOOL'), tools });
  const call = first.choices[0].message.tool_calls[0];
  const second = await client.chat.completions.create({
    tools,
    messages: [
      ...ask('FORCE-TOOL'),
      { role: 'assistant', content: null, reasoning: first.choices[0].message.reasoning, tool_calls: [call] },
      { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21}' },
      { role: 'user', content: 'Thanks. FORCE-FINAL' },
    ],
  });
  assert.equal(second.choices[0].message.content, 'Hello, world! ¿Qué tal? 👋');
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens);
});

check('responses: reasoning item then function_call item, plain and streamed', async () => {
  const params = { input: 'What is the weather? FORCE-TOOL', tools: flatTools, max_output_tokens: 200 };
  const r = await client.responses.create(params);
  assert.equal(r.status, 'completed');
  assert.deepEqual(r.output.map((i) => i.type), ['reasoning', 'function_call']);
  assert.equal(r.output[0].content[0].text, 'The user wants the weather in Paris. I will call get_weather.');
  assert.equal(r.output[1].name, 'get_weather');
  assert.equal(r.output[1].arguments, TOOL_ARGS);
  assert.match(r.output[1].call_id, /^call_/);
  assert.equal(r.output_text, '');

  const events = [];
  for await (const e of await client.responses.create({ ...params, stream: true })) events.push(e);
  const args = events.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
  assert.equal(args, TOOL_ARGS);
  const reasoning = events.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('');
  assert.equal(reasoning, r.output[0].content[0].text);
  const added = events.filter((e) => e.type === 'response.output_item.added').map((e) => e.item.type);
  assert.deepEqual(added, ['reasoning', 'function_call']);
  const doneCall = events.find((e) => e.type === 'response.function_call_arguments.done');
  assert.equal(doneCall.arguments, TOOL_ARGS);
  assert.equal(events.at(-1).type, 'response.completed');
  assert.deepEqual(events.at(-1).response.output.map((i) => i.type), ['reasoning', 'function_call']);
});

check('responses: reasoning then message; function_call_output round trip', async () => {
  const r = await client.responses.create({ input: 'Hi FORCE-FINAL', max_output_tokens: 200 });
  assert.deepEqual(r.output.map((i) => i.type), ['reasoning', 'message']);
  assert.equal(r.output_text, 'Hello, world! ¿Qué tal? 👋');
  let text = '';
  for await (const e of await client.responses.create({ input: 'Hi FORCE-FINAL', stream: true }))
    if (e.type === 'response.output_text.delta') text += e.delta;
  assert.equal(text, r.output_text);

  const call = (await client.responses.create({ input: 'What is the weather? FORCE-TOOL', tools: flatTools })).output[1];
  const next = await client.responses.create({
    tools: flatTools,
    input: [
      { role: 'user', content: 'What is the weather? FORCE-TOOL' },
      { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
      { type: 'function_call_output', call_id: call.call_id, output: '{"temperature": 21}' },
      { role: 'user', content: 'And now? FORCE-FINAL' },
    ],
  });
  assert.equal(next.output_text, 'Hello, world! ¿Qué tal? 👋');
});
