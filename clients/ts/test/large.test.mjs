// SPDX-License-Identifier: Apache-2.0

// Large answers through the Express middleware and the Fastify plugin, on
// a real idemsvc with Redis and a blob store (versitygw): stored by a
// streamed complete and replayed from GET /v1/keys/body, byte for byte,
// with this process's memory and idemsvc's bounded; a damaged or missing
// object never replays a wrong body; a small answer still goes inline.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readdirSync, statSync, unlinkSync, openSync, readSync, writeSync, closeSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import Fastify from 'fastify';
import { IdemClient } from '@idemsvc/client';
import { idempotency as expressIdempotency } from '@idemsvc/client/express';
import { idempotency as fastifyIdempotency } from '@idemsvc/client/fastify';
import { freePort, startIdemsvc, startRedis, startVersitygw, uniqueKey } from './harness.mjs';

const MiB = 1 << 20;
const CHUNK = 64 << 10;
const BIG = 40 * MiB;
// Bounds of the contract and of this test: idemsvc under 300 MB; this
// process (app, middleware and the test's own client) growing by less
// than the answer's own 41.9 MB while it goes through twice, so that a
// body held whole anywhere fails it (measured: 0 to 15 MB).
const IDEMSVC_RSS_BOUND = 300e6;
const NODE_GROWTH_BOUND = 40e6;

/** The answer's bytes: 64 KiB chunks of a fixed pattern, each marked with its index; made as they are sent. */
function* pattern(size) {
  const base = Buffer.alloc(CHUNK);
  for (let i = 0; i < CHUNK; i++) base[i] = (i * 7919 + 13) & 0xff;
  for (let off = 0, n = 0; off < size; off += CHUNK, n++) {
    const chunk = Buffer.from(base.subarray(0, Math.min(CHUNK, size - off)));
    if (chunk.length >= 4) chunk.writeUInt32BE(n, 0);
    yield chunk;
  }
}

function sha256Of(size) {
  const h = createHash('sha256');
  for (const chunk of pattern(size)) h.update(chunk);
  return h.digest('hex');
}

/**
 * A request as an end user sends it, its answer hashed as it comes (never
 * held): status, headers, the body's length and SHA-256, and whether it
 * ended whole (false: the connection was cut).
 */
function call(baseUrl, path, key) {
  return new Promise((resolve, reject) => {
    const body = '{"order":1}';
    const req = http.request(
      `${baseUrl}${path}`,
      { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'idempotency-key': `"${key}"` } },
      (res) => {
        const h = createHash('sha256');
        let length = 0;
        let settled = false;
        const done = (whole) => {
          if (settled) return;
          settled = true;
          resolve({ status: res.statusCode, headers: res.headers, length, sha256: h.digest('hex'), whole });
        };
        res.on('data', (chunk) => {
          h.update(chunk);
          length += chunk.length;
        });
        res.on('end', () => done(true));
        res.on('error', () => done(false));
        res.on('aborted', () => done(false));
        res.on('close', () => done(res.complete));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

/** Samples this process's RSS until stopped; the peak. */
function sampleRss() {
  let peak = process.memoryUsage().rss;
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 10);
  return () => {
    clearInterval(timer);
    return Math.max(peak, process.memoryUsage().rss);
  };
}

/** The object file of the given size under dir (sizes are unique per test). */
function objectOfSize(dir, size) {
  for (const name of readdirSync(dir, { recursive: true })) {
    const path = join(dir, String(name));
    const st = statSync(path);
    if (st.isFile() && st.size === size) return path;
  }
  throw new Error(`no object of ${size} bytes under ${dir}`);
}

let redis;
let store;
let svc;
let idem;

before(async () => {
  redis = await startRedis();
  store = await startVersitygw();
  svc = await startIdemsvc({ redisUrl: redis.url, env: store.env('ts') });
  idem = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey });
});

after(async () => {
  await svc?.stop();
  await store?.stop();
  await redis?.stop();
});

async function storedRecord(key) {
  let record;
  const end = Date.now() + 60_000;
  for (;;) {
    record = await idem.status(key, { includeResponse: true });
    if (record.state !== 'in_progress') return record;
    if (Date.now() > end) throw new Error(`${key} still in progress`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const frameworks = {
  async express(options) {
    const runs = { count: 0 };
    const app = express();
    app.use(expressIdempotency(idem, options));
    app.post('/answer', (req, res) => {
      runs.count++;
      const size = Number(req.query.size);
      if (size <= 1024) return res.status(201).json({ ok: true, size });
      res.status(201).set('Content-Type', 'application/octet-stream');
      Readable.from(pattern(size)).pipe(res);
    });
    const port = await freePort();
    const server = await new Promise((resolve) => {
      const s = app.listen(port, '127.0.0.1', () => resolve(s));
    });
    return { baseUrl: `http://127.0.0.1:${port}`, runs, close: () => new Promise((r) => server.close(r)) };
  },
  async fastify(options) {
    const runs = { count: 0 };
    const app = Fastify();
    await app.register(fastifyIdempotency, { client: idem, ...options });
    app.post('/answer', async (request, reply) => {
      runs.count++;
      const size = Number(request.query.size);
      if (size <= 1024) return reply.code(201).send({ ok: true, size });
      return reply.code(201).type('application/octet-stream').send(Readable.from(pattern(size)));
    });
    const port = await freePort();
    await app.listen({ port, host: '127.0.0.1' });
    return { baseUrl: `http://127.0.0.1:${port}`, runs, close: () => app.close() };
  },
};

for (const [name, start] of Object.entries(frameworks)) {
  describe(`a large answer through ${name}`, () => {
    let app;
    before(async () => {
      app = await start({ maxStreamedBodyBytes: 64 * MiB });
    });
    after(async () => {
      await app?.close();
    });

    test('40 MiB are stored streamed and replayed byte for byte, memory bounded', async (t) => {
      const want = sha256Of(BIG);
      // Warm up the app, the middleware and the client first.
      await call(app.baseUrl, '/answer?size=16', uniqueKey());
      const base = process.memoryUsage().rss;
      const peak = sampleRss();
      const key = uniqueKey('big');
      const first = await call(app.baseUrl, '/answer?size=' + BIG, key);
      assert.equal(first.status, 201);
      assert.ok(first.whole);
      assert.equal(first.length, BIG);
      assert.equal(first.sha256, want);
      assert.equal(first.headers['idempotent-replayed'], undefined);

      const record = await storedRecord(key);
      assert.equal(record.state, 'completed');
      assert.equal(record.response.body, undefined);
      assert.equal(record.response.body_ref?.size_bytes, BIG, 'stored by reference, not without its body');
      assert.equal(record.response.body_ref.sha256, want);
      assert.equal(record.response.headers?.['Idempotent-Body-Omitted'], undefined);

      const replay = await call(app.baseUrl, '/answer?size=' + BIG, key);
      const peakRss = peak();
      assert.equal(replay.status, 201);
      assert.ok(replay.whole);
      assert.equal(replay.headers['idempotent-replayed'], 'true');
      assert.equal(replay.headers['content-type'], 'application/octet-stream');
      assert.equal(replay.headers['content-length'], String(BIG));
      assert.equal(replay.length, BIG);
      assert.equal(replay.sha256, want);
      assert.equal(app.runs.count, 2); // the warm-up and the first

      const growth = peakRss - base;
      const idemsvcPeak = svc.peakRss();
      t.diagnostic(`${name}: node RSS ${(base / 1e6).toFixed(0)} MB -> peak ${(peakRss / 1e6).toFixed(0)} MB (+${(growth / 1e6).toFixed(0)} MB); idemsvc VmHWM ${(idemsvcPeak / 1e6).toFixed(0)} MB`);
      assert.ok(growth < NODE_GROWTH_BOUND, `this process grew by ${growth} bytes`);
      assert.ok(idemsvcPeak < IDEMSVC_RSS_BOUND, `idemsvc peaked at ${idemsvcPeak} bytes`);
    });

    test('a small answer is still stored inline', async () => {
      const key = uniqueKey('small');
      const first = await call(app.baseUrl, '/answer?size=16', key);
      assert.equal(first.status, 201);
      const record = await storedRecord(key);
      assert.equal(record.response.body_ref, undefined);
      assert.equal(record.response.body, '{"ok":true,"size":16}');
      const replay = await call(app.baseUrl, '/answer?size=16', key);
      assert.equal(replay.status, 201);
      assert.equal(replay.headers['idempotent-replayed'], 'true');
      assert.equal(replay.sha256, first.sha256);
    });

    test('a damaged object is never replayed whole: the answer is cut off, then 503', async () => {
      // A size of its own, to find its object by.
      const size = 3 * MiB + (name === 'express' ? 17 : 19);
      const key = uniqueKey('damaged');
      const first = await call(app.baseUrl, `/answer?size=${size}`, key);
      assert.equal(first.sha256, sha256Of(size));
      const record = await storedRecord(key);
      assert.equal(record.response.body_ref?.size_bytes, size);
      const runs = app.runs.count;

      // One byte changed below the S3 API, the store's own checksum kept.
      const path = objectOfSize(store.bucketDir, size);
      const fd = openSync(path, 'r+');
      const b = Buffer.alloc(1);
      readSync(fd, b, 0, 1, size >> 1);
      b[0] ^= 0xff;
      writeSync(fd, b, 0, 1, size >> 1);
      closeSync(fd);

      const broken = await call(app.baseUrl, `/answer?size=${size}`, key);
      if (broken.status === 201) {
        assert.equal(broken.whole, false, 'a wrong body was replayed whole');
        assert.ok(broken.length < size, `${broken.length} of ${size} bytes came`);
      } else {
        assert.equal(broken.status, 503);
      }
      await new Promise((r) => setTimeout(r, 200)); // a handler run after the cut would have begun by now
      assert.equal(app.runs.count, runs, 'the operation ran again');
      const again = await call(app.baseUrl, `/answer?size=${size}`, key);
      assert.equal(again.status, 503);
      assert.equal(again.headers['retry-after'], '1');
      assert.equal(app.runs.count, runs, 'the operation ran again');
    });

    test('a missing object answers 503 and never runs the operation again', async () => {
      const size = 3 * MiB + (name === 'express' ? 23 : 29);
      const key = uniqueKey('missing');
      await call(app.baseUrl, `/answer?size=${size}`, key);
      const record = await storedRecord(key);
      assert.equal(record.response.body_ref?.size_bytes, size);
      const runs = app.runs.count;
      unlinkSync(objectOfSize(store.bucketDir, size));
      const replay = await call(app.baseUrl, `/answer?size=${size}`, key);
      assert.equal(replay.status, 503);
      assert.equal(replay.headers['retry-after'], '1');
      assert.equal(replay.headers['content-type'], 'application/problem+json');
      assert.equal(app.runs.count, runs);
      assert.equal((await idem.status(key)).state, 'completed');
    });
  });

  for (const [how, options, size] of [
    ['without streaming', {}, 2 * MiB + 5],
    ['past maxStreamedBodyBytes', { maxStreamedBodyBytes: 2 * MiB }, 3 * MiB + 5],
  ]) describe(`a large answer through ${name} ${how}`, () => {
    let app;
    before(async () => {
      app = await start(options);
    });
    after(async () => {
      await app?.close();
    });

    test('is sent whole, and stored without its body', async () => {
      const key = uniqueKey('omitted');
      const first = await call(app.baseUrl, `/answer?size=${size}`, key);
      assert.equal(first.sha256, sha256Of(size));
      const record = await storedRecord(key);
      assert.equal(record.response.body_ref, undefined);
      assert.equal(record.response.headers['Idempotent-Body-Omitted'], 'true');
      const replay = await call(app.baseUrl, `/answer?size=${size}`, key);
      assert.equal(replay.headers['idempotent-body-omitted'], 'true');
      assert.equal(replay.length, 0);
    });
  });
}
