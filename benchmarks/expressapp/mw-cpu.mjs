// SPDX-License-Identifier: Apache-2.0

// The Express middleware's own CPU per request, apart from idemsvc and the
// client's calls: the app of app.mjs behind the SDK's middleware (clients/ts,
// or the build in SDK_DIST), on a client whose begin and complete answer at
// once without a call, so that what the app spends beyond the app alone is
// the middleware's own work (key, body, fingerprint, credentials' HMAC,
// capture and flush of the answer, the lease's timer):
//
//   node mw-cpu.mjs --listen 127.0.0.1:8094 stub [SDK_DIST]
//   node mw-cpu.mjs --listen 127.0.0.1:8094 stub-raw [SDK_DIST]
//       the same, mounted after express.json({ verify: keepRawBody })
//   node mw-cpu.mjs --listen 127.0.0.1:8095 alone
//
// GET /cpu answers the process's CPU (user and system µs) so far, so that a
// load driver (idembench --mix pay) reads it before and after its load.
// Not a test: the client is stubbed only to take idemsvc out of the figure.
import express from 'express';
import { fileURLToPath } from 'node:url';

const args = process.argv.slice(2);
if (args[0] !== '--listen' || !args[1] || !args[2]) {
  console.error('usage: mw-cpu.mjs --listen HOST:PORT stub [SDK_DIST] | alone');
  process.exit(2);
}
const [host, port] = args[1].split(':');
const mode = args[2];

const app = express();
app.disable('x-powered-by');
app.disable('etag');
app.get('/', (_req, res) => res.end());
app.get('/cpu', (_req, res) => {
  const { user, system } = process.cpuUsage();
  res.json({ user, system });
});

const pay = (_req, res) => {
  res.status(201).type('application/json').send('{"payment":"accepted"}\n\n');
};

if (mode === 'alone') {
  app.post('/pay', express.json(), pay);
} else if (mode === 'stub' || mode === 'stub-raw') {
  const dist = args[3] ?? fileURLToPath(new URL('../../clients/ts/dist/', import.meta.url));
  const { IdemClient } = await import(`${dist}/index.js`);
  const { idempotency, keepRawBody } = await import(`${dist}/express.js`);
  const client = new IdemClient({ baseUrl: 'http://127.0.0.1:1', apiKey: 'bench-key' });
  let attempt = 0;
  const leaseExpires = new Date(Date.now() + 3_600_000).toISOString();
  client.begin = async (req) => ({ status: 'acquired', key: req.key, lease_token: 'token', attempt: ++attempt, lease_expires_at: leaseExpires });
  client.complete = async (req) => ({ key: req.key, state: 'completed', attempt });
  client.fail = async (req) => ({ key: req.key, state: 'failed', attempt });
  if (mode === 'stub') app.post('/pay', idempotency(client), express.json(), pay);
  else app.post('/pay', express.json({ verify: keepRawBody }), idempotency(client), pay);
} else {
  console.error(`mw-cpu.mjs: unknown mode ${mode}`);
  process.exit(2);
}

app.listen(Number(port), host);
process.on('SIGTERM', () => process.exit(0));
