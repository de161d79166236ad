// Load and faults against the real server: 200 concurrent streaming chat requests on the CPU demo model,
// a random half of them dropped by the client at a random moment (before the first byte, mid-stream).
// Afterwards the server must be idle again: no running or waiting requests, no KV pages in use, nothing
// admitted at the HTTP layer; and a fresh request succeeds.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';

import { startServer, removeScratch } from './lib/server.mjs';
import { scrapeMetrics, metric, ssePayloads } from './lib/raw_http.mjs';

const STREAMS = 200;
let server;

before(async () => {
  server = await startServer({ args: ['--max-running-requests', '64', '--max-queued-requests', '512', '--io-threads', '2'] });
});

after(async () => {
  const { code, signal } = await server.stop();
  removeScratch();
  assert.equal(code, 0, `mxserve exit: code ${code}, signal ${signal}\n${server.stderr()}`);
});

// A small seeded generator, so a failing run can be replayed with MX_E2E_SEED.
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// One streaming request. `dropAfterMs` (or null): destroy the socket that long after sending.
// Resolves to {status, body, dropped}.
function streamOnce(port, i, dropAfterMs) {
  const body = JSON.stringify({
    messages: [{ role: 'user', content: `Request ${i}: say something.` }],
    stream: true,
    max_tokens: 6,
    seed: i,
  });
  return new Promise((resolve) => {
    const req = http.request({
      host: '127.0.0.1', port, method: 'POST', path: '/v1/chat/completions', agent: false,
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
    });
    let status = 0;
    let text = '';
    let done = false;
    const settle = (dropped) => {
      if (done) return;
      done = true;
      resolve({ status, body: text, dropped });
    };
    req.on('response', (res) => {
      status = res.statusCode;
      res.setEncoding('utf8');
      res.on('data', (d) => (text += d));
      res.on('end', () => settle(false));
      res.on('error', () => settle(true));
      res.on('aborted', () => settle(true));
    });
    req.on('error', () => settle(true));
    req.on('close', () => setImmediate(() => settle(true)));
    req.end(body);
    if (dropAfterMs !== null) {
      setTimeout(() => {
        if (!done) req.destroy();
        settle(true);
      }, dropAfterMs);
    }
  });
}

async function waitForIdle(url, ms = 20_000) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    const m = await scrapeMetrics(url);
    last = {
      running: metric(m, 'mxserve:num_requests_running'),
      waiting: metric(m, 'mxserve:num_requests_waiting'),
      kv: metric(m, 'mxserve:kv_cache_usage_perc'),
      inflight: metric(m, 'mxserve:http_requests_in_flight'),
    };
    if (last.running === 0 && last.waiting === 0 && last.kv === 0 && last.inflight === 0) return last;
    if (Date.now() > deadline) return last;
    await new Promise((r) => setTimeout(r, 100));
  }
}

test(`${STREAMS} concurrent streams with random disconnects leave the server idle`, async () => {
  const seed = Number(process.env.MX_E2E_SEED ?? Date.now() % 100000);
  console.log(`load seed ${seed} (replay with MX_E2E_SEED=${seed})`);
  const random = rng(seed);
  const plans = Array.from({ length: STREAMS }, () => (random() < 0.5 ? Math.floor(random() * 400) : null));
  const started = Date.now();
  const results = await Promise.all(plans.map((drop, i) => streamOnce(server.port, i, drop)));
  const elapsed = Date.now() - started;

  let completed = 0;
  for (const [i, r] of results.entries()) {
    if (r.dropped) continue;
    assert.equal(r.status, 200, `stream ${i}: ${r.body.slice(0, 300)}`);
    const payloads = ssePayloads(r.body);
    assert.equal(payloads.at(-1), '[DONE]', `stream ${i} did not end with [DONE]`);
    const finish = payloads.slice(0, -1).map((p) => JSON.parse(p)).flatMap((c) => c.choices).find((c) => c.finish_reason);
    assert.ok(finish && ['stop', 'length'].includes(finish.finish_reason), `stream ${i}: finish ${JSON.stringify(finish)}`);
    ++completed;
  }
  const dropped = results.filter((r) => r.dropped).length;
  console.log(`${completed} streams completed, ${dropped} dropped by the client, in ${elapsed} ms`);
  assert.ok(completed >= STREAMS / 4, `only ${completed} streams completed`);

  const idle = await waitForIdle(server.url);
  assert.deepEqual(idle, { running: 0, waiting: 0, kv: 0, inflight: 0 }, 'server not idle after the load');

  const res = await fetch(`${server.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'still there?' }], max_tokens: 4 }),
  });
  const text = await res.text();
  assert.equal(res.status, 200, text);
  const json = JSON.parse(text);
  assert.equal(json.choices.length, 1);
  assert.ok(json.usage.completion_tokens >= 1);
});
