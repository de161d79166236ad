// Malformed and hostile requests against the real `mxserve serve` (API key set), over a plain socket:
// each gets its status and the OpenAI error envelope {"error": {"message", "type", "param", "code"}}, the
// server stays up after every one, and a normal request still succeeds at the end.
// tests/unit/server_bad_input_test.cc runs a larger list against the HTTP layer in-process; this one
// proves the shipped binary behaves the same, auth and the generation service included.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';

import { startServer, removeScratch } from './lib/server.mjs';
import { rawExchange, makeRequest } from './lib/raw_http.mjs';

const KEY = 'sk-e2e-bad-input';
const AUTH = `Authorization: Bearer ${KEY}`;
let server;

before(async () => {
  server = await startServer({ args: ['--api-key', KEY, '--metrics-require-key', '--context-length', '4096'] });
});

after(async () => {
  const { code, signal } = await server.stop();
  removeScratch();
  assert.equal(code, 0, `mxserve exit: code ${code}, signal ${signal}\n${server.stderr()}`);
});

const post = (target, body, headers = [AUTH]) => makeRequest('POST', target, body, headers);
const chat = (extra) => post('/v1/chat/completions', `{"messages":[{"role":"user","content":"hi"}]${extra}}`);
const chat_with = (content, extra = '') => post('/v1/chat/completions', `{"messages":[{"role":"user","content":${content}}]${extra}}`);
const raw = (text) => Buffer.from(text, 'latin1');

function cases() {
  const deepArray = '['.repeat(30000) + ']'.repeat(30000);
  const deepObjects = '{"a":'.repeat(70) + '1' + '}'.repeat(70);
  let manyHeaders = 'GET /health HTTP/1.1\r\nHost: x\r\n';
  for (let i = 0; i < 2000; ++i) manyHeaders += `X-H${i}: v\r\n`;
  const stops = JSON.stringify(Array.from({ length: 100 }, (_, i) => `s${i}`));
  const seventeenMiB = Buffer.alloc(17 << 20, 'a');
  return [
    // ---- HTTP framing ----
    { name: 'garbage request line', bytes: raw('GARBAGE\r\n\r\n'), status: 400 },
    { name: 'HTTP/9.9', bytes: raw('GET /health HTTP/9.9\r\nHost: x\r\n\r\n'), status: 400 },
    { name: 'header line without a colon', bytes: raw('GET /health HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n'), status: 400 },
    { name: 'non-numeric Content-Length', bytes: raw(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n${AUTH}\r\nContent-Length: abc\r\n\r\n`), status: 400 },
    { name: 'two different Content-Lengths', bytes: raw(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}`), status: 400 },
    { name: 'bad chunk size', bytes: raw('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n'), status: 400 },
    { name: 'truncated body, then half-close', bytes: raw(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n${AUTH}\r\nContent-Length: 100\r\n\r\n{"messages"`), endWrite: true, status: 400 },
    { name: 'BREW on /v1/models', bytes: makeRequest('BREW', '/v1/models', '', [AUTH]), status: 405 },
    { name: 'DELETE on chat', bytes: makeRequest('DELETE', '/v1/chat/completions', '', [AUTH]), status: 405 },
    { name: 'GET on completions', bytes: makeRequest('GET', '/v1/completions', '', [AUTH]), status: 405 },
    { name: 'POST on /health', bytes: makeRequest('POST', '/health', '{}'), status: 405 },
    { name: 'unknown route', bytes: makeRequest('GET', '/v2/everything', '', [AUTH]), status: 404, code: 'unknown_route' },
    { name: 'path traversal', bytes: makeRequest('GET', '/../../etc/passwd', '', [AUTH]), status: 404 },
    { name: 'unknown model in /v1/models/{id}', bytes: makeRequest('GET', '/v1/models/gpt-4', '', [AUTH]), status: 404, code: 'model_not_found' },
    { name: '20 KiB header', bytes: makeRequest('GET', '/health', '', [`X-Big: ${'a'.repeat(20000)}`]), status: 431 },
    { name: '2000 small headers', bytes: raw(manyHeaders + '\r\n'), status: 431 },
    { name: '20 KiB target', bytes: makeRequest('GET', '/' + 'p'.repeat(20000)), status: 431 },
    { name: 'declared 100 MB body', bytes: raw(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n${AUTH}\r\nContent-Length: 100000000\r\n\r\n{`), status: 413 },
    { name: '17 MiB body actually sent', bytes: post('/v1/chat/completions', seventeenMiB), status: 413 },
    { name: 'chunked body over the limit', bytes: Buffer.concat([raw(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n${AUTH}\r\nTransfer-Encoding: chunked\r\n\r\n1000000\r\n`), Buffer.alloc(0x1000000, 'a'), raw('\r\n20\r\n' + 'a'.repeat(32) + '\r\n0\r\n\r\n')]), status: 413 },
    // ---- auth ----
    { name: 'no API key', bytes: makeRequest('GET', '/v1/models'), status: 401, type: 'authentication_error', code: 'invalid_api_key' },
    { name: 'wrong API key', bytes: makeRequest('GET', '/v1/models', '', ['Authorization: Bearer sk-wrong']), status: 401, type: 'authentication_error' },
    { name: 'key as a prefix of the real one', bytes: makeRequest('GET', '/v1/models', '', [`Authorization: Bearer ${KEY.slice(0, -1)}`]), status: 401 },
    { name: 'Basic scheme', bytes: makeRequest('GET', '/v1/models', '', [`Authorization: Basic ${KEY}`]), status: 401 },
    { name: 'no key on chat', bytes: post('/v1/chat/completions', '{"messages":[{"role":"user","content":"hi"}]}', []), status: 401 },
    { name: 'no key on /metrics (--metrics-require-key)', bytes: makeRequest('GET', '/metrics'), status: 401 },
    // ---- content type and bytes ----
    { name: 'Content-Type text/plain', bytes: post('/v1/chat/completions', '{"messages":[{"role":"user","content":"hi"}]}', [AUTH, 'Content-Type: text/plain']), status: 415 },
    { name: 'Content-Type form-urlencoded', bytes: post('/v1/completions', '{"prompt":"hi"}', [AUTH, 'Content-Type: application/x-www-form-urlencoded']), status: 415 },
    { name: 'empty body', bytes: post('/v1/chat/completions', ''), status: 400 },
    { name: 'truncated JSON', bytes: post('/v1/chat/completions', '{"messages":[{"role":"user"'), status: 400 },
    { name: 'JSON array body', bytes: post('/v1/chat/completions', '[1,2]'), status: 400 },
    { name: 'invalid UTF-8 byte', bytes: post('/v1/chat/completions', Buffer.from('{"messages":[{"role":"user","content":"\xff"}]}', 'latin1')), status: 400 },
    { name: 'overlong UTF-8', bytes: post('/v1/chat/completions', Buffer.from('{"messages":[{"role":"user","content":"\xc0\xaf"}]}', 'latin1')), status: 400 },
    { name: 'UTF-8 surrogate', bytes: post('/v1/chat/completions', Buffer.from('{"messages":[{"role":"user","content":"\xed\xa0\x80"}]}', 'latin1')), status: 400 },
    { name: 'NUL byte outside strings', bytes: post('/v1/chat/completions', '{"messages":\0[]}'), status: 400 },
    { name: '30k nested arrays', bytes: post('/v1/chat/completions', `{"messages":${deepArray}}`), status: 400 },
    { name: '70 nested objects', bytes: chat(`,"metadata":${deepObjects}`), status: 400 },
    { name: 'number overflow', bytes: chat(',"temperature":1e999'), status: 400 },
    // ---- fields ----
    { name: 'messages a string', bytes: post('/v1/chat/completions', '{"messages":"hi"}'), status: 400, param: 'messages' },
    { name: 'unknown role', bytes: post('/v1/chat/completions', '{"messages":[{"role":"wizard","content":"x"}]}'), status: 400, param: 'messages[0].role' },
    { name: 'content a number', bytes: post('/v1/chat/completions', '{"messages":[{"role":"user","content":5}]}'), status: 400, param: 'messages[0].content' },
    { name: 'image content part', bytes: post('/v1/chat/completions', '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x"}}]}]}'), status: 400, param: 'messages[0].content[0].type' },
    { name: 'temperature a string', bytes: chat(',"temperature":"hot"'), status: 400, param: 'temperature' },
    { name: 'negative max_tokens', bytes: chat(',"max_tokens":-5'), status: 400, param: 'max_tokens' },
    { name: 'absurd max_tokens', bytes: chat(',"max_tokens":1e30'), status: 400, param: 'max_tokens' },
    { name: 'max_tokens beyond the context', bytes: chat(',"max_tokens":5000'), status: 400, param: 'max_tokens', code: 'context_length_exceeded' },
    { name: 'n = 100000', bytes: chat(',"n":100000'), status: 400, param: 'n' },
    { name: 'negative top_k', bytes: chat(',"top_k":-7'), status: 400, param: 'top_k' },
    { name: '100 stop strings', bytes: chat(`,"stop":${stops}`), status: 400, param: 'stop' },
    { name: 'seed a string', bytes: chat(',"seed":"abc"'), status: 400, param: 'seed' },
    { name: 'stream_options without stream', bytes: chat(',"stream_options":{"include_usage":true}'), status: 400, param: 'stream_options' },
    { name: 'tools an object', bytes: chat(',"tools":{"type":"function"}'), status: 400, param: 'tools' },
    { name: 'tool_choice names a missing tool', bytes: chat(',"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}'), status: 400, param: 'tool_choice' },
    { name: 'unknown model', bytes: chat(',"model":"gpt-4"'), status: 404, param: 'model', code: 'model_not_found' },
    { name: 'completions negative token id', bytes: post('/v1/completions', '{"prompt":[-1]}'), status: 400, param: 'prompt[0]' },
    { name: 'completions prompt an object', bytes: post('/v1/completions', '{"prompt":{"text":"x"}}'), status: 400, param: 'prompt' },
    { name: 'responses previous_response_id', bytes: post('/v1/responses', '{"input":"x","previous_response_id":"resp_1"}'), status: 400, param: 'previous_response_id' },
    // ---- checked by the generation service (tokens, context) ----
    { name: 'token id beyond the vocabulary', bytes: post('/v1/completions', '{"prompt":[1,2,300000]}'), status: 400 },
    { name: 'prompt longer than the context', bytes: chat_with(`"${'hello '.repeat(5000)}"`), status: 400, code: 'context_length_exceeded' },
    { name: 'prompt + max_tokens over the context', bytes: chat_with(`"${'hello '.repeat(2000)}"`, ',"max_tokens":4000'), status: 400, code: 'context_length_exceeded' },
    { name: 'responses input a number', bytes: post('/v1/responses', '{"input":7}'), status: 400, param: 'input' },
  ];
}

function checkEnvelope(name, reply, expected) {
  assert.equal(reply.status, expected.status, `${name}: status ${reply.status}, body ${reply.body.slice(0, 300)}`);
  assert.match(reply.headers['content-type'] ?? '', /^application\/json/, `${name}: content-type`);
  let json;
  assert.doesNotThrow(() => (json = JSON.parse(reply.body)), `${name}: body is not JSON: ${reply.body.slice(0, 300)}`);
  const error = json.error;
  assert.ok(error && typeof error === 'object', `${name}: no error object: ${reply.body}`);
  assert.deepEqual(Object.keys(error).sort(), ['code', 'message', 'param', 'type'], `${name}: envelope keys`);
  assert.equal(typeof error.message, 'string', `${name}: message`);
  assert.ok(error.message.length > 0, `${name}: empty message`);
  assert.equal(typeof error.type, 'string', `${name}: type`);
  assert.ok(error.param === null || typeof error.param === 'string', `${name}: param`);
  assert.ok(error.code === null || typeof error.code === 'string', `${name}: code`);
  if (expected.param) assert.equal(error.param, expected.param, `${name}: param`);
  if (expected.code) assert.equal(error.code, expected.code, `${name}: code`);
  if (expected.type) assert.equal(error.type, expected.type, `${name}: type`);
  if (reply.status === 405) assert.ok(reply.headers.allow, `${name}: 405 without Allow`);
}

test('every hostile request gets its status and the OpenAI envelope, and the server goes on', async () => {
  const list = cases();
  assert.ok(list.length >= 30, `only ${list.length} cases`);
  assert.equal(new Set(list.map((c) => c.name)).size, list.length, 'case names must be distinct');
  for (const c of list) {
    const reply = await rawExchange(server.port, c.bytes, { endWrite: c.endWrite });
    checkEnvelope(c.name, reply, c);
    const health = await fetch(`${server.url}/health`);  // open without a key
    assert.equal(health.status, 200, `/health after ${c.name}`);
  }
});

test('unknown fields and nulls are accepted, not refused', async () => {
  const body = JSON.stringify({
    messages: [{ role: 'user', content: 'hi', name: 'bob' }],
    user: 'u1', metadata: { k: 'v' }, store: false, service_tier: 'auto', parallel_tool_calls: true,
    stop: null, tools: null, seed: null, logit_bias: {}, some_future_field: [1, 2, 3], max_tokens: 2,
  });
  const reply = await rawExchange(server.port, post('/v1/chat/completions', body));
  assert.equal(reply.status, 200, reply.body);
});

test('a normal request succeeds after all of it', async () => {
  const reply = await rawExchange(server.port, post('/v1/chat/completions', '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4}'));
  assert.equal(reply.status, 200, reply.body);
  const json = JSON.parse(reply.body);
  assert.equal(json.object, 'chat.completion');
  assert.equal(typeof json.choices[0].message.content, 'string');
});
