// SPDX-License-Identifier: Apache-2.0

// The conformance app: the handler that every entry point under test puts
// in front of (cases.json says what it answers). Run alone it serves on a
// free loopback port and prints "listening <port>" on its first line of
// output; `GET /__calls` on that port tells how many times the app ran.
//
//   node conformance/app.mjs [port]
//
// Imported, it gives the same handler for Express, Fastify or node:http.
import http from 'node:http';
import { pathToFileURL } from 'node:url';

/** The answer of a too-large response: over idemsvc's 1 MiB stored-response limit. */
export const LARGE_BYTES = 1572864;

/**
 * createApp returns a node:http handler and its run counter. Every request
 * it handles counts as one run, whatever its path; its body is read in full.
 * The run an answer names counts the requests with the same key header.
 */
export function createApp() {
  let runs = 0;
  const runsByKey = new Map();
  async function handler(req, res) {
    for await (const _ of req) { /* read the body in full */ }
    runs++;
    const key = String(req.headers['idempotency-key'] ?? '');
    const run = (runsByKey.get(key) ?? 0) + 1;
    runsByKey.set(key, run);
    const url = new URL(req.url, 'http://app');
    const [, route, arg] = url.pathname.split('/');
    switch (route) {
      case 'answer': {
        answer(res, Number(arg), run);
        return;
      }
      case 'slow': {
        await new Promise((resolve) => setTimeout(resolve, Number(arg)));
        answer(res, 201, run);
        return;
      }
      case 'binary': {
        const body = Buffer.alloc(260);
        for (let i = 0; i < 256; i++) body[i] = i;
        body.writeUInt32BE(run, 256);
        res.writeHead(200, { 'Content-Type': 'application/octet-stream' });
        res.end(body);
        return;
      }
      case 'large': {
        res.writeHead(200, { 'Content-Type': 'text/plain' });
        res.end(Buffer.alloc(LARGE_BYTES, 'a'));
        return;
      }
      case 'crash':
        // The handler fails before any answer: Express and Fastify answer
        // 500; the server below, idemproxy's upstream, breaks the connection.
        throw new Error('crash');
      default:
        res.writeHead(404, { 'Content-Type': 'text/plain' });
        res.end('no such route\n');
    }
  }
  return { handler, runs: () => runs };
}

// answer sends status with a JSON body naming the run, an allow-listed
// Location, and X-Run, which is not allow-listed and so never replayed.
function answer(res, status, run) {
  res.writeHead(status, {
    'Content-Type': 'application/json',
    Location: '/things/1',
    'X-Run': String(run),
  });
  res.end(JSON.stringify({ run }));
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const app = createApp();
  const server = http.createServer((req, res) => {
    if (req.url === '/__calls') {
      res.writeHead(200, { 'Content-Type': 'text/plain' });
      res.end(String(app.runs()));
      return;
    }
    app.handler(req, res).catch(() => req.socket.destroy());
  });
  server.keepAliveTimeout = 60_000;
  server.listen(Number(process.argv[2] ?? 0), '127.0.0.1', () => {
    console.log(`listening ${server.address().port}`);
  });
  process.on('SIGTERM', () => server.close(() => process.exit(0)));
}
