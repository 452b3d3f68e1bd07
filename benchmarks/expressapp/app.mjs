// SPDX-License-Identifier: Apache-2.0

// The Express app of the caller's-path benchmark (make load-sdk): POST /pay
// answers 201 with the 24-byte JSON body of benchmarks/payapp, served
//
//   node app.mjs --listen 127.0.0.1:8090 alone
//   node app.mjs --listen 127.0.0.1:8091 sdk URL [SDK_DIST]
//       behind the TypeScript SDK's Express middleware (clients/ts, or the
//       build in SDK_DIST) with its defaults, on idemsvc at URL, the API
//       key from IDEMSVC_API_KEY;
//   node app.mjs --listen 127.0.0.1:8096 sdk-coalesce URL [SDK_DIST]
//       the same, its client with coalesce: the begins, and the completes,
//       of the requests in one turn of the event loop go as one batch call;
//   node app.mjs --listen 127.0.0.1:8093 raw URL SDK_DIST
//       the handler itself calling the SDK's begin and complete on the
//       request's key, without the middleware: what the two calls cost
//       apart from the middleware's own work (by hand, not in make load-sdk);
//   node app.mjs --listen 127.0.0.1:8092 lib REDIS_URL
//       behind express-idempotency with its Redis adapter, the most used
//       Express idempotency middleware on npm that keeps answers in Redis,
//       in process, on the Redis at REDIS_URL.
//
// GET / answers 200 once the app is ready.
import express from 'express';
import { fileURLToPath } from 'node:url';

const args = process.argv.slice(2);
if (args[0] !== '--listen' || !args[1] || !args[2]) {
  console.error('usage: app.mjs --listen HOST:PORT alone | sdk URL [SDK_DIST] | sdk-coalesce URL [SDK_DIST] | raw URL SDK_DIST | lib REDIS_URL');
  process.exit(2);
}
const [host, port] = args[1].split(':');
const mode = args[2];

const app = express();
app.disable('x-powered-by');
app.disable('etag');
app.get('/', (_req, res) => res.end());

const pay = (_req, res) => {
  res.status(201).type('application/json').send('{"payment":"accepted"}\n\n');
};

if (mode === 'alone') {
  app.post('/pay', express.json(), pay);
} else if (mode === 'sdk' || mode === 'sdk-coalesce') {
  const dist = args[4] ?? fileURLToPath(new URL('../../clients/ts/dist/', import.meta.url));
  const { IdemClient } = await import(`${dist}/index.js`);
  const { idempotency } = await import(`${dist}/express.js`);
  const coalesce = mode === 'sdk-coalesce';
  const client = new IdemClient({ baseUrl: args[3], apiKey: process.env.IDEMSVC_API_KEY, coalesce });
  app.post('/pay', idempotency(client), express.json(), pay);
} else if (mode === 'raw') {
  const { IdemClient } = await import(`${args[4]}/index.js`);
  const client = new IdemClient({ baseUrl: args[3], apiKey: process.env.IDEMSVC_API_KEY });
  app.post('/pay', express.json(), async (req, res) => {
    const key = req.headers['idempotency-key'];
    const b = await client.begin({ key, fingerprint: 'v1:x', lease_ms: 30000 });
    await client.complete({ key, lease_token: b.lease_token, response: { status_code: 201, body: 'x' } });
    pay(req, res);
  });
} else if (mode === 'lib') {
  const { idempotency } = await import('express-idempotency');
  const { default: { default: RedisAdapter } } = await import('express-idempotency-redis-adapter'); // CommonJS: exports.default
  const adapter = new RedisAdapter({ connectionConfig: { url: args[3] } });
  await adapter.connect();
  // Mounted after the body parser: it keeps the parsed body to compare a
  // duplicate's with.
  app.post('/pay', express.json(), idempotency({ dataAdapter: adapter }), pay);
} else {
  console.error(`app.mjs: unknown mode ${mode}`);
  process.exit(2);
}

app.listen(Number(port), host);

// Exit on SIGTERM, so that node --cpu-prof writes its profile.
process.on('SIGTERM', () => process.exit(0));
