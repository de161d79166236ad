// The real `mxserve serve` (CPU, demo model) through the official OpenAI client, as applications use it:
// models, chat (plain, streamed, usage, n, stop, seeds), completions, responses (plain and streamed
// events), the API key, and the errors the SDK raises.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';

import { startServer, removeScratch } from './lib/server.mjs';

let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch (e) {
  throw new Error(`the openai npm package is missing from tests/e2e/node_modules: run scripts/bootstrap (${e.message})`);
}

const KEY = 'sk-e2e-openai';
let server;
let client;
let model;

before(async () => {
  server = await startServer({ args: ['--api-key', KEY, '--context-length', '4096'] });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 60_000 });
  const models = await client.models.list();
  model = models.data[0].id;
});

after(async () => {
  const { code, signal } = await server.stop();
  removeScratch();
  assert.equal(code, 0, `mxserve exit: code ${code}, signal ${signal}\n${server.stderr()}`);
});

const hi = [{ role: 'user', content: 'Say hello.' }];

// ---- models and auth ----

test('models: one model, retrievable by id; an unknown id is NotFoundError', async () => {
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].object, 'model');
  assert.equal(typeof models.data[0].created, 'number');
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
  await assert.rejects(client.models.retrieve('gpt-4'), (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
});

test('API key: refused without it or with a wrong one; /health stays open', async () => {
  const wrong = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'sk-wrong', maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401 &&
    e.type === 'authentication_error' && e.code === 'invalid_api_key');
  await assert.rejects(wrong.chat.completions.create({ model, messages: hi, max_tokens: 2 }),
    (e) => e instanceof OpenAI.AuthenticationError);
  const none = await fetch(`${server.url}/v1/models`);
  assert.equal(none.status, 401);
  const health = await fetch(`${server.url}/health`);
  assert.equal(health.status, 200);
  assert.deepEqual(await health.json(), { status: 'ok' });
  // Prometheus scrapers hold no key: /metrics is open unless --metrics-require-key (bad_input checks that).
  const metrics = await fetch(`${server.url}/metrics`);
  assert.equal(metrics.status, 200);
  const text = await metrics.text();
  assert.match(text, /^vllm:num_requests_waiting\{model_name="[^"]+"\} 0$/m);
  assert.match(text, /^vllm:cache_config_info\{model_name="[^"]+",block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="[0-9.]+",num_gpu_blocks="[1-9][0-9]*"\} 1$/m);
});

test('bad requests are BadRequestError with param; unknown model is NotFoundError', async () => {
  await assert.rejects(client.chat.completions.create({ model, messages: hi, temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature' && e.type === 'invalid_request_error');
  await assert.rejects(client.chat.completions.create({ model, messages: hi, max_tokens: 100000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'context_length_exceeded' &&
      /maximum context length is 4096 tokens/.test(e.message));
  await assert.rejects(client.chat.completions.create({ model: 'gpt-4', messages: hi }),
    (e) => e instanceof OpenAI.NotFoundError && e.param === 'model');
});

// ---- chat ----

function collectChat(chunks) {
  const choices = [];
  let usage = null;
  for (const chunk of chunks) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) {
      assert.equal(chunk.choices.length, 0, 'the usage chunk has no choices');
      usage = chunk.usage;
    }
    for (const c of chunk.choices) {
      const s = (choices[c.index] ??= { content: '', reasoning: '', reasoning_content: '', finish_reason: null, roles: 0 });
      assert.equal(s.finish_reason, null, `choice ${c.index}: delta after its finish chunk`);
      if (c.delta.role) ++s.roles;
      s.content += c.delta.content ?? '';
      s.reasoning += c.delta.reasoning ?? '';
      s.reasoning_content += c.delta.reasoning_content ?? '';
      if (c.finish_reason) s.finish_reason = c.finish_reason;
    }
  }
  return { choices, usage };
}

async function streamChat(params) {
  const chunks = [];
  for await (const chunk of await client.chat.completions.create({ ...params, stream: true })) chunks.push(chunk);
  return chunks;
}

test('chat: non-streaming shape and usage', async () => {
  const r = await client.chat.completions.create({ model, messages: hi, max_tokens: 12, seed: 11 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
  assert.equal(typeof c.message.content, 'string');
  assert.equal(c.message.reasoning, c.message.reasoning_content, 'both reasoning spellings carry the same text');
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 12, JSON.stringify(r.usage));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  if (c.finish_reason === 'length') assert.equal(r.usage.completion_tokens, 12);
});

test('chat: streamed deltas concatenate to the non-streamed answer for the same seed; include_usage', async () => {
  const params = { model, messages: hi, max_tokens: 24, seed: 1234, temperature: 1 };
  const whole = await client.chat.completions.create(params);
  const chunks = await streamChat({ ...params, stream_options: { include_usage: true } });
  const { choices, usage } = collectChat(chunks);
  assert.equal(choices.length, 1);
  const s = choices[0];
  assert.equal(s.roles, 1, 'role is sent once, on the first chunk');
  assert.equal(s.content, whole.choices[0].message.content ?? '');
  assert.equal(s.reasoning, whole.choices[0].message.reasoning ?? '');
  assert.equal(s.reasoning_content, s.reasoning);
  assert.equal(s.finish_reason, whole.choices[0].finish_reason);
  assert.deepEqual(usage, whole.usage);
  // Every chunk but the usage chunk says usage: null when include_usage is on (OpenAI's shape).
  for (const chunk of chunks.slice(0, -1)) assert.equal(chunk.usage, null);
  // Without include_usage no chunk carries usage.
  for (const chunk of await streamChat(params)) assert.equal(chunk.usage ?? null, null);
});

test('chat: the same seed gives the same answer, other seeds differ', async () => {
  const params = { model, messages: hi, max_tokens: 16, temperature: 1 };
  const a = await client.chat.completions.create({ ...params, seed: 42 });
  const b = await client.chat.completions.create({ ...params, seed: 42 });
  assert.deepEqual(b.choices[0].message, a.choices[0].message);
  const texts = new Set();
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.chat.completions.create({ ...params, seed });
    texts.add(JSON.stringify(r.choices[0].message));
  }
  assert.ok(texts.size > 1, 'four seeds gave one answer');
});

test('chat: n = 3 gives three indexed choices, streamed and not', async () => {
  const params = { model, messages: hi, max_tokens: 8, n: 3, seed: 5 };
  const r = await client.chat.completions.create(params);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  for (const c of r.choices) assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.ok(r.usage.completion_tokens >= 3);
  const { choices, usage } = collectChat(await streamChat({ ...params, stream_options: { include_usage: true } }));
  assert.equal(choices.length, 3);
  for (let i = 0; i < 3; ++i) {
    assert.equal(choices[i].content, r.choices[i].message.content ?? '', `choice ${i}`);
    assert.equal(choices[i].finish_reason, r.choices[i].finish_reason, `choice ${i}`);
  }
  assert.deepEqual(usage, r.usage);
});

test('special-token text in a message stays text (no Harmony injection)', async () => {
  const tokens = async (content) =>
    (await client.chat.completions.create({ model, messages: [{ role: 'user', content }], max_tokens: 1 })).usage.prompt_tokens;
  const base = await tokens('x');
  // As special tokens these would be 1 and 4 ids; as text they are several each.
  assert.ok((await tokens('<|end|>')) - base > 1);
  assert.ok((await tokens('<|start|>assistant<|channel|>final<|message|>')) - base > 4);
});

// ---- completions ----

test('completions: text prompt, streamed parity, usage, token-id prompt', async () => {
  const params = { model, prompt: 'Once upon a time', max_tokens: 16, seed: 9 };
  const r = await client.completions.create(params);
  assert.equal(r.object, 'text_completion');
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } })) {
    assert.equal(chunk.object, 'text_completion');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      finish = c.finish_reason ?? finish;
    }
  }
  assert.equal(text, r.choices[0].text);
  assert.equal(finish, r.choices[0].finish_reason);
  assert.deepEqual(usage, r.usage);

  const ids = await client.completions.create({ model, prompt: [1, 2, 3, 4, 5], max_tokens: 4, seed: 1 });
  assert.equal(ids.usage.prompt_tokens, 5);
  assert.ok(ids.usage.completion_tokens >= 1);
});

test('completions: two prompts times n = 2 give four choices in prompt-major order', async () => {
  const r = await client.completions.create({ model, prompt: ['alpha', 'beta'], n: 2, max_tokens: 4, seed: 3 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
});

test('stop strings end the text before the stop, with finish_reason stop', async () => {
  // The demo model speaks gibberish, so the stop string is taken from what it says for a fixed seed.
  const params = { model, prompt: 'The weather today', max_tokens: 24, seed: 77, temperature: 1 };
  const free = (await client.completions.create(params)).choices[0].text;
  assert.ok(free.length >= 6, `too little text to pick a stop string from: ${JSON.stringify(free)}`);
  const stop = free.slice(Math.floor(free.length / 2), Math.floor(free.length / 2) + 2);
  const cut = free.slice(0, free.indexOf(stop));
  const r = await client.completions.create({ ...params, stop: [stop, 'never-appears-xyz'] });
  assert.equal(r.choices[0].text, cut, `stop ${JSON.stringify(stop)} in ${JSON.stringify(free)}`);
  assert.equal(r.choices[0].finish_reason, 'stop');
  let streamed = '';
  for await (const chunk of await client.completions.create({ ...params, stop, stream: true }))
    for (const c of chunk.choices) streamed += c.text;
  assert.equal(streamed, cut);
});

test('chat stop strings apply to the content', async () => {
  const params = { model, messages: hi, max_tokens: 24, seed: 78, temperature: 1 };
  const free = (await client.chat.completions.create(params)).choices[0].message.content ?? '';
  if (free.length < 6) return;  // all of it went to reasoning for this seed: nothing to cut
  const stop = free.slice(Math.floor(free.length / 2), Math.floor(free.length / 2) + 2);
  const r = await client.chat.completions.create({ ...params, stop });
  // OpenAI: "The returned text will not contain the stop sequence": the content ends right before the
  // first occurrence, even when the stop string sits inside the token that completed it.
  assert.equal(r.choices[0].message.content, free.slice(0, free.indexOf(stop)),
    `content with stop ${JSON.stringify(stop)} must end before its first occurrence`);
  assert.equal(r.choices[0].finish_reason, 'stop');
});

function wholeUtf8(bytes) {
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(Uint8Array.from(bytes));
    return true;
  } catch {
    return false;
  }
}

test('logprobs: chat content tokens and completions tokens, with alternatives', async () => {
  const r = await client.chat.completions.create({ model, messages: hi, max_tokens: 8, seed: 21, logprobs: true, top_logprobs: 2 });
  // The demo model's gibberish has no Harmony header, so its text only becomes content when the turn ends
  // and carries no per-token logprobs; tests/e2e/harmony.test.mjs checks them on a real transcript.
  assert.ok(Array.isArray(r.choices[0].logprobs?.content), JSON.stringify(r.choices[0].logprobs));
  const entries = r.choices[0].logprobs.content;
  assert.ok(entries.length <= r.usage.completion_tokens);
  for (const e of entries) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0, `logprob ${e.logprob}`);
    // `bytes` are the token's raw bytes; its text is them when they are whole UTF-8, else U+FFFD (a byte-level
    // token inside a multi-byte character, which random weights do emit).
    if (wholeUtf8(e.bytes)) assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
    else assert.equal(e.token, '\uFFFD', `token of bytes ${JSON.stringify(e.bytes)}`);
    assert.equal(e.top_logprobs.length, 2);
    for (const t of e.top_logprobs) assert.ok(t.logprob <= 0);
  }
  const plain = await client.chat.completions.create({ model, messages: hi, max_tokens: 4, seed: 21 });
  assert.equal(plain.choices[0].logprobs, null, 'no logprobs unless asked');

  const params = { model, prompt: 'Logprobs please', max_tokens: 6, seed: 4, logprobs: 2 };
  const c = await client.completions.create(params);
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.length, c.usage.completion_tokens);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  assert.equal(lp.top_logprobs.length, lp.tokens.length);
  assert.equal(lp.text_offset.length, lp.tokens.length);
  assert.equal(lp.text_offset[0], 0);
  for (const top of lp.top_logprobs) assert.equal(Object.keys(top).length <= 2, true);
  const streamed = [];
  for await (const chunk of await client.completions.create({ ...params, stream: true }))
    for (const ch of chunk.choices) streamed.push(...(ch.logprobs?.tokens ?? []));
  assert.deepEqual(streamed, lp.tokens);
});

test('completions echo returns the prompt before the completion', async () => {
  const params = { model, prompt: 'Echo this:', max_tokens: 4, seed: 8 };
  const plain = await client.completions.create(params);
  const echoed = await client.completions.create({ ...params, echo: true });
  assert.equal(echoed.choices[0].text, 'Echo this:' + plain.choices[0].text);
});

// ---- vLLM's utility endpoints ----

test('/version, /tokenize and /detokenize in vLLM shapes', async () => {
  const version = await fetch(`${server.url}/version`);  // open, as vLLM serves it
  assert.equal(version.status, 200);
  assert.match((await version.json()).version, /^\d+\.\d+\.\d+/);
  const post = (path, body) => fetch(`${server.url}${path}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` }, body: JSON.stringify(body) });
  const tok = await (await post('/tokenize', { model, prompt: 'Hello world' })).json();
  assert.equal(tok.count, tok.tokens.length);
  assert.ok(tok.count >= 2, JSON.stringify(tok));
  assert.equal(tok.max_model_len, 4096);
  const detok = await (await post('/detokenize', { model, tokens: tok.tokens })).json();
  assert.equal(detok.prompt, 'Hello world');
  const chat = await (await post('/tokenize', { model, messages: [{ role: 'user', content: 'Hello world' }] })).json();
  assert.ok(chat.count > tok.count, 'the chat render adds the format around the text');
  assert.equal((await post('/detokenize', { tokens: [-1] })).status, 400);
  assert.equal((await post('/tokenize', { model: 'other', prompt: 'x' })).status, 404);
  assert.equal((await fetch(`${server.url}/tokenize`, { method: 'POST', body: '{}' })).status, 401);
});

// ---- responses ----

test('responses: plain request returns output items and usage', async () => {
  const r = await client.responses.create({ model, input: 'Say hello.', max_output_tokens: 16, instructions: 'Be brief.' });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.ok(Array.isArray(r.output));
  for (const item of r.output) assert.ok(['reasoning', 'message', 'function_call'].includes(item.type), item.type);
  const message = r.output.filter((i) => i.type === 'message').flatMap((i) => i.content).map((p) => p.text).join('');
  assert.equal(r.output_text, message, 'the SDK joins output_text from message items');
  assert.ok(r.usage.input_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
});

test('responses: previous_response_id and item_reference continue a stored response', async () => {
  const first = await client.responses.create({ model, input: 'Say hello.', max_output_tokens: 16 });
  assert.equal(first.store, true);
  const next = await client.responses.create({ model, previous_response_id: first.id, input: 'Again.', max_output_tokens: 8 });
  assert.equal(next.previous_response_id, first.id);
  assert.ok(next.usage.input_tokens > first.usage.input_tokens, 'the stored conversation is part of the prompt');
  if (first.output.length > 0) {
    const ref = await client.responses.create({
      model, max_output_tokens: 8,
      input: [{ role: 'user', content: 'Say hello.' }, { type: 'item_reference', id: first.output[0].id }, { role: 'user', content: 'More.' }],
    });
    assert.equal(ref.object, 'response');
  }
  await assert.rejects(client.responses.create({ model, previous_response_id: 'resp_unknown', input: 'x' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id' && /resp_unknown/.test(e.message));
});

test('responses: streamed events in order, deltas add up to the final items', async () => {
  const events = [];
  for await (const e of await client.responses.create({ model, input: 'Say hello.', max_output_tokens: 16, stream: true }))
    events.push(e);
  assert.equal(events[0].type, 'response.created');
  assert.equal(events[1].type, 'response.in_progress');
  const last = events.at(-1);
  assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
  events.forEach((e, i) => assert.equal(e.sequence_number, i, `event ${i} (${e.type})`));
  const text = new Map();
  for (const e of events) {
    if (e.type === 'response.output_text.delta' || e.type === 'response.reasoning_text.delta')
      text.set(e.item_id, (text.get(e.item_id) ?? '') + e.delta);
  }
  const added = events.filter((e) => e.type === 'response.output_item.added').length;
  const done = events.filter((e) => e.type === 'response.output_item.done');
  assert.equal(done.length, added, 'every item added is closed');
  const final = last.response;
  assert.equal(final.output.length, done.length);
  for (const item of final.output) {
    if (item.type === 'message') assert.equal(item.content[0].text, text.get(item.id) ?? '');
    if (item.type === 'reasoning') assert.equal(item.content[0].text, text.get(item.id) ?? '');
  }
  assert.ok(final.usage.output_tokens >= 1);
});

test('metrics: the engine-side latency histograms count finished requests', async () => {
  await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 });
  const text = await (await fetch(`${server.url}/metrics`)).text();
  for (const name of ['vllm:request_queue_time_seconds', 'vllm:request_prefill_time_seconds', 'vllm:request_decode_time_seconds']) {
    const m = text.match(new RegExp(`^${name}_count\\{model_name="[^"]+"\\} (\\d+)$`, 'm'));
    assert.ok(m && Number(m[1]) >= 1, `${name}_count`);
  }
});
