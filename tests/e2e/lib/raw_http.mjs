// HTTP over a plain socket: exact bytes out, one whole response back (Content-Length, chunked, or
// read-to-close), so tests can send what no well-behaved client would.
import net from 'node:net';

// Sends `bytes` (string or Buffer) and resolves to {status, headers, body, raw}; status 0 when the
// connection ended or `timeoutMs` passed before a complete response. `endWrite` half-closes after sending.
export function rawExchange(port, bytes, { timeoutMs = 10_000, endWrite = false } = {}) {
  return new Promise((resolve) => {
    const socket = net.connect({ port, host: '127.0.0.1' });
    let data = Buffer.alloc(0);
    let settled = false;
    const finish = (reply) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(reply);
    };
    const timer = setTimeout(() => finish(parseResponse(data, true) ?? { status: 0, headers: {}, body: '', raw: data }), timeoutMs);
    socket.on('connect', () => {
      // The server may answer (413, 431) and close before it has read everything: ignore write errors.
      socket.write(bytes, () => {
        if (endWrite) socket.end();
      });
    });
    socket.on('data', (chunk) => {
      data = Buffer.concat([data, chunk]);
      const reply = parseResponse(data, false);
      if (reply) finish(reply);
    });
    socket.on('error', () => {});  // a reset after the answer is fine; what arrived is judged on close
    socket.on('close', () => finish(parseResponse(data, true) ?? { status: 0, headers: {}, body: '', raw: data }));
  });
}

// A complete response at the start of `data`, or null. `closed`: the connection ended, so a body without
// length runs to here. 1xx interim responses (100 Continue) are skipped.
export function parseResponse(data, closed) {
  let offset = 0;
  for (;;) {
    const headEnd = data.indexOf('\r\n\r\n', offset);
    if (headEnd < 0) return null;
    const head = data.subarray(offset, headEnd).toString('latin1').split('\r\n');
    const m = /^HTTP\/\d\.\d (\d{3})/.exec(head[0]);
    if (!m) return null;
    const status = Number(m[1]);
    const headers = {};
    for (const line of head.slice(1)) {
      const colon = line.indexOf(':');
      if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
    }
    const bodyStart = headEnd + 4;
    if (status >= 100 && status < 200) {
      offset = bodyStart;
      continue;
    }
    const rest = data.subarray(bodyStart);
    if (headers['content-length'] !== undefined) {
      const n = Number(headers['content-length']);
      if (rest.length < n) return null;
      return { status, headers, body: rest.subarray(0, n).toString('utf8'), raw: data };
    }
    if (/chunked/i.test(headers['transfer-encoding'] ?? '')) {
      const body = dechunk(rest);
      if (body === null) return closed ? { status, headers, body: rest.toString('utf8'), raw: data, truncated: true } : null;
      return { status, headers, body: body.toString('utf8'), raw: data };
    }
    return closed ? { status, headers, body: rest.toString('utf8'), raw: data } : null;
  }
}

// The body of a complete chunked encoding, or null while incomplete.
function dechunk(buf) {
  const parts = [];
  let pos = 0;
  for (;;) {
    const lineEnd = buf.indexOf('\r\n', pos);
    if (lineEnd < 0) return null;
    const size = parseInt(buf.subarray(pos, lineEnd).toString('latin1'), 16);
    if (Number.isNaN(size)) return null;
    pos = lineEnd + 2;
    if (size === 0) return buf.indexOf('\r\n', pos) >= 0 ? Buffer.concat(parts) : null;
    if (buf.length < pos + size + 2) return null;
    parts.push(buf.subarray(pos, pos + size));
    pos += size + 2;
  }
}

// A request with correct framing. `headers` are full lines without CRLF; Host is added.
export function makeRequest(method, target, body = '', headers = []) {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8');
  let head = `${method} ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n`;
  for (const h of headers) head += `${h}\r\n`;
  if (bytes.length > 0 || method === 'POST') {
    if (!headers.some((h) => /^content-type:/i.test(h))) head += 'Content-Type: application/json\r\n';
    head += `Content-Length: ${bytes.length}\r\n`;
  }
  return Buffer.concat([Buffer.from(head + '\r\n', 'latin1'), bytes]);
}

// The `data:` payloads of an SSE body, in order ("[DONE]" included), and the `event:` names.
export function ssePayloads(body) {
  return body
    .split('\n\n')
    .flatMap((event) => event.split('\n'))
    .filter((line) => line.startsWith('data: '))
    .map((line) => line.slice(6));
}

// Fetches GET /metrics and returns {name{labels}: value} for every sample line.
export async function scrapeMetrics(url, apiKey) {
  const res = await fetch(`${url}/metrics`, { headers: apiKey ? { Authorization: `Bearer ${apiKey}` } : {} });
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}`);
  const samples = {};
  for (const line of (await res.text()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const space = line.lastIndexOf(' ');
    samples[line.slice(0, space)] = Number(line.slice(space + 1));
  }
  return samples;
}

// The value of the first sample whose name (before any `{`) is `name`.
export function metric(samples, name) {
  for (const [key, value] of Object.entries(samples)) if (key.split('{')[0] === name) return value;
  return undefined;
}
