// The Vercel AI SDK's default tool loop against mxserve: `generateText` with a tool and two steps over the
// Responses API (the SDK's default for OpenAI models). Step 2 continues step 1 by referencing its reasoning
// item (`item_reference`), which a stateless server refuses. The demo model has random weights, so the
// engine plays a scripted Harmony tool call (`--test-forced-tokens`) whenever the user's marker is present.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

import { startServer, removeScratch } from './lib/server.mjs';

let ai, createOpenAI, z;
try {
  ai = await import('ai');
  ({ createOpenAI } = await import('@ai-sdk/openai'));
  ({ z } = await import('zod'));
} catch (e) {
  throw new Error(`the AI SDK packages are missing from tests/e2e/node_modules: run scripts/bootstrap (${e.message})`);
}

const CALL =
  '<|channel|>analysis<|message|>I need the weather first.<|end|>' +
  '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>';

let server;
let scratch;

before(async () => {
  scratch = mkdtempSync(path.join(tmpdir(), 'mx-e2e-aisdk-'));
  const file = path.join(scratch, 'transcripts.json');
  writeFileSync(file, JSON.stringify({ transcripts: [{ match: 'AISDK-TOOL', text: CALL }] }));
  server = await startServer({ args: ['--test-forced-tokens', file] });
});

after(async () => {
  if (!server) return;
  const { code, signal } = await server.stop();
  removeScratch();
  rmSync(scratch, { recursive: true, force: true });
  assert.equal(code, 0, `mxserve exit: code ${code}, signal ${signal}\n${server.stderr()}`);
});

test('AI SDK generateText: the default two-step tool loop over the Responses API', async () => {
  const bodies = [];  // what the SDK sends, to check that step 2 used a reference
  const openai = createOpenAI({
    baseURL: `${server.url}/v1`, apiKey: 'unused',
    fetch: async (url, init) => { bodies.push(JSON.parse(init.body)); return fetch(url, init); },
  });
  const calls = [];
  const result = await ai.generateText({
    model: openai('mxserve-demo'),
    prompt: 'What is the weather in Paris? AISDK-TOOL',
    tools: {
      get_weather: ai.tool({
        description: 'Current weather in a city.',
        inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => {
          calls.push(city);
          return { city, forecast: 'sunny' };
        },
      }),
    },
    stopWhen: ai.stepCountIs(2),
    maxRetries: 0,
  });
  assert.equal(result.steps.length, 2, 'both steps ran: step 2 was accepted');
  assert.deepEqual(calls, ['Paris', 'Paris'], 'each step called the tool with the scripted arguments');
  assert.equal(result.steps[0].toolCalls[0].toolName, 'get_weather');
  // Step 2 named step 1's reasoning item by reference (the request a stateless server refuses).
  assert.equal(bodies.length, 2);
  const refs = bodies[1].input.filter((item) => item.type === 'item_reference');
  assert.ok(refs.length >= 1, `step 2 sent no item_reference: ${JSON.stringify(bodies[1].input).slice(0, 400)}`);
});
