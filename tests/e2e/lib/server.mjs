// Runs `mxserve serve` as users do: a child process on a free port (`--port 0`; the port is read from the
// "listening on http://HOST:PORT" line it prints), stopped with SIGTERM, which must drain and exit 0.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

const live = new Set();
// A test that throws must not leave servers behind (ctest would wait on their inherited pipes).
process.on('exit', () => {
  for (const child of live) child.kill('SIGKILL');
});

const SETPRIV = '/usr/bin/setpriv';

export function mxserveBinary() {
  const bin = process.env.MXSERVE_BIN;
  if (!bin) throw new Error('MXSERVE_BIN is not set (ctest sets it to the built mxserve)');
  return bin;
}

// Starts the server; resolves once it listens. `args` are extra flags. The demo model is made on first use
// under the cache directory, so every server of a test run shares one scratch XDG_CACHE_HOME.
export async function startServer({ args = [], startupMs = 120_000 } = {}) {
  const cacheHome = process.env.MX_E2E_CACHE ?? (process.env.MX_E2E_CACHE = mkdtempSync(path.join(tmpdir(), 'mx-e2e-')));
  const argv = ['serve', '--port', '0', '--backend', 'cpu', '--log-level', 'warning', ...args];
  // Through util-linux's setpriv (where there is one), the server gets SIGKILL when this process dies however
  // it dies (a CTest timeout, a killed run), instead of serving on, reparented to init, holding the pipes and
  // descriptors it inherited; the 'exit' handler above covers only a normal exit.
  const [command, commandArgs] = existsSync(SETPRIV) ? [SETPRIV, ['--pdeathsig', 'KILL', '--', mxserveBinary(), ...argv]]
    : [mxserveBinary(), argv];
  const child = spawn(command, commandArgs, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, XDG_CACHE_HOME: cacheHome },
  });
  live.add(child);
  let stderr = '';
  child.stderr.on('data', (d) => {
    stderr += d;
    if (stderr.length > 1 << 20) stderr = stderr.slice(-(1 << 19));
  });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  exited.then(() => live.delete(child));

  const port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`mxserve did not listen within ${startupMs} ms\n${stderr}`)), startupMs);
    child.stdout.on('data', (d) => {
      out += d;
      const m = /listening on http:\/\/[^\s]*:(\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`mxserve ${argv.join(' ')} exited (code ${code}, signal ${signal}) before listening\n${stderr}`));
    });
  });

  // The server listens before the model is loaded (/health says 503 "loading" meanwhile).
  const deadline = Date.now() + startupMs;
  for (;;) {
    const res = await fetch(`http://127.0.0.1:${port}/health`).catch(() => null);
    if (res && (await res.text(), res.status === 200)) break;
    if (child.exitCode !== null || Date.now() > deadline)
      throw new Error(`mxserve did not become ready (last /health ${res?.status})\n${stderr}`);
    await new Promise((r) => setTimeout(r, 50));
  }

  return {
    port,
    url: `http://127.0.0.1:${port}`,
    stderr: () => stderr,
    // SIGTERM, then wait: resolves to {code, signal}. A server that hangs past `ms` is killed and reported.
    async stop(ms = 30_000) {
      if (child.exitCode !== null || child.signalCode !== null) return exited;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), ms);
      const result = await exited;
      clearTimeout(timer);
      return result;
    },
  };
}

// Removes the scratch cache made by startServer (call once per test file, after the last stop).
export function removeScratch() {
  const dir = process.env.MX_E2E_CACHE;
  if (dir && dir.startsWith(tmpdir())) rmSync(dir, { recursive: true, force: true });
}
