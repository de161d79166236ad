// Admission and shutdown of the real server. Admission: with one running and one queued slot held,
// further requests get 503 `queue_full` with Retry-After (SGLang's --max-queued-requests semantics), and
// pass again once the slots are free. Shutdown: SIGTERM while a long stream runs refuses new work, lets the
// stream run for --shutdown-timeout, then ends it with finish_reason "abort", and the process exits 0.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { startServer, removeScratch } from './lib/server.mjs';
import { ssePayloads, scrapeMetrics, metric } from './lib/raw_http.mjs';

const chatBody = (extra) => JSON.stringify({ messages: [{ role: 'user', content: 'Tell me a long story.' }], ...extra });
async function waitForMetric(url, name, value, ms = 20_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const now = metric(await scrapeMetrics(url), name);
    if (now === value) return;
    if (Date.now() > deadline) throw new Error(`${name} stayed ${now}, expected ${value}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const post = (url, body) =>
  fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body });

test('admission: with the running and the queued slot taken, 8 more requests get 503 queue_full', async () => {
  const server = await startServer({ args: ['--max-running-requests', '1', '--max-queued-requests', '1'] });
  try {
    // A runs (its first chunk arrived), B waits behind it: both slots are held, deterministically.
    const long = chatBody({ stream: true, max_tokens: 20000, ignore_eos: true });
    const a = new AbortController();
    const b = new AbortController();
    const resA = await fetch(`${server.url}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: long, signal: a.signal });
    assert.equal(resA.status, 200);
    const readerA = resA.body.getReader();
    await readerA.read();
    const resB = fetch(`${server.url}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: long, signal: b.signal }).catch(() => null);
    await waitForMetric(server.url, 'mxserve:http_requests_in_flight', 2);
    const replies = await Promise.all(Array.from({ length: 8 }, () => post(server.url, chatBody({ max_tokens: 2 }))));
    for (const r of replies) {
      const json = await r.json();
      assert.equal(r.status, 503, JSON.stringify(json));
      assert.equal(r.headers.get('retry-after'), '1');
      assert.equal(json.error.type, 'unavailable_error');
      assert.equal(json.error.code, 'queue_full');
    }
    const rejected = metric(await scrapeMetrics(server.url), 'mxserve:rejected_requests_total');
    assert.ok(rejected >= 8, `rejected_requests_total ${rejected}`);
    // The clients leave; their slots come back and requests pass again.
    a.abort();
    b.abort();
    await resB;
    await waitForMetric(server.url, 'mxserve:http_requests_in_flight', 0);
    for (let i = 0; i < 3; ++i) assert.equal((await post(server.url, chatBody({ max_tokens: 2 }))).status, 200);
  } finally {
    const { code } = await server.stop();
    assert.equal(code, 0, server.stderr());
  }
});

test('SIGTERM drains: new work refused, the running stream ends with abort after the timeout, exit 0', async () => {
  const server = await startServer({ args: ['--shutdown-timeout', '1'] });
  let stopped = false;
  try {
    // A stream that would run far longer than the shutdown timeout.
    const res = await post(server.url, chatBody({ stream: true, max_tokens: 3000, ignore_eos: true }));
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    let text = new TextDecoder().decode((await reader.read()).value);  // it has started
    const started = Date.now();
    const exit = server.stop(30_000);
    stopped = true;
    // While draining: /health is 503 or the listener is already closed; never a new 200.
    await new Promise((r) => setTimeout(r, 200));
    const health = await fetch(`${server.url}/health`).catch(() => null);
    assert.ok(health === null || health.status === 503, `health while draining: ${health?.status}`);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    const elapsed = Date.now() - started;
    const payloads = ssePayloads(text);
    assert.equal(payloads.at(-1), '[DONE]', 'the aborted stream still ends with [DONE]');
    const finish = payloads.slice(0, -1).map((p) => JSON.parse(p)).flatMap((c) => c.choices).find((c) => c.finish_reason);
    assert.equal(finish?.finish_reason, 'abort');
    assert.ok(elapsed >= 800 && elapsed < 10_000, `the stream ended ${elapsed} ms after SIGTERM (timeout 1 s)`);
    const { code, signal } = await exit;
    assert.equal(code, 0, `exit code ${code}, signal ${signal}\n${server.stderr()}`);
  } finally {
    if (!stopped) await server.stop();
    removeScratch();
  }
});
