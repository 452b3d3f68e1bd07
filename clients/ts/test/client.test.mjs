// SPDX-License-Identifier: Apache-2.0

// IdemClient against a real idemsvc, on its in-memory store and on Redis.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createHash } from 'node:crypto';
import http from 'node:http';
import { Readable } from 'node:stream';
import { BodyMismatchError, decodeResponse, encodeResponse, IdemClient, IdemError } from '@idemsvc/client';
import { freePort, startIdemsvc, startOn, startRedis, stores, uniqueKey } from './harness.mjs';

for (const store of stores) {
  describe(`IdemClient on ${store}`, () => {
    let svc;
    let idem;
    before(async () => {
      svc = await startOn(store);
      idem = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey });
    });
    after(() => svc.stop());

    test('begin acquires, complete stores, and the next begin replays the response', async () => {
      const key = uniqueKey();
      const lease = await idem.begin({ key, fingerprint: 'f1' });
      assert.equal(lease.status, 'acquired');
      assert.equal(lease.attempt, 1);
      assert.equal(lease.recovered, false);
      assert.match(lease.lease_token, /^[0-9a-f]{32}$/);

      const done = await idem.complete({
        key,
        lease_token: lease.lease_token,
        response: { status_code: 201, headers: { 'Content-Type': 'application/json' }, body: '{"id":1}' },
      });
      assert.equal(done.status, 'completed');
      assert.equal(done.attempt, 1);

      const replay = await idem.begin({ key, fingerprint: 'f1' });
      assert.equal(replay.status, 'completed');
      assert.deepEqual(decodeResponse(replay.response), {
        statusCode: 201,
        headers: { 'Content-Type': 'application/json' },
        body: '{"id":1}',
      });
    });

    test('completeStream stores a body sent as a stream, and openBody streams it back checked', async () => {
      const key = uniqueKey();
      const lease = await idem.begin({ key });
      const bytes = new Uint8Array(300 * 1024).map((_, i) => (i * 7919) % 256);
      const chunks = [bytes.subarray(0, 100_000), bytes.subarray(100_000)];
      const stream = new ReadableStream({
        pull(controller) {
          const next = chunks.shift();
          if (next) controller.enqueue(next);
          else controller.close();
        },
      });
      const done = await idem.completeStream(
        { key, lease_token: lease.lease_token, status_code: 201, headers: { 'Content-Type': 'application/octet-stream', 'X-Note': 'café' } },
        stream,
      );
      assert.equal(done.status, 'completed');
      const replay = await idem.begin({ key });
      const decoded = decodeResponse(replay.response);
      assert.equal(decoded.statusCode, 201);
      assert.equal(decoded.headers['X-Note'], 'café');
      assert.deepEqual(new Uint8Array(decoded.body), bytes);
      const { body, size } = await idem.openBody(key);
      assert.equal(size, bytes.length);
      const got = [];
      for await (const chunk of body) got.push(chunk);
      assert.deepEqual(new Uint8Array(Buffer.concat(got)), bytes);
      // Over the stored-response limit without a blob store: 413.
      const other = await idem.begin({ key: uniqueKey() });
      const err = await idem.completeStream({ key: other.key, lease_token: other.lease_token }, new Uint8Array(1024 * 1024 + 1))
        .then(() => assert.fail('stored past the limit'), (e) => e);
      assert.equal(err.kind, 'too-large');
    });

    test('a begin retried with the same owner gets the same lease; another owner gets in-progress', async () => {
      const key = uniqueKey();
      const first = await idem.begin({ key, owner: 'worker-1' });
      const again = await idem.begin({ key, owner: 'worker-1' });
      assert.equal(again.lease_token, first.lease_token);
      assert.equal(again.attempt, first.attempt);

      const err = await idem.begin({ key }).then(() => assert.fail('acquired a held key'), (e) => e);
      assert.ok(err instanceof IdemError);
      assert.equal(err.kind, 'in-progress');
      assert.equal(err.problem.code, 'in-progress');
      assert.equal(err.status, 409);
      assert.equal(err.problem.attempt, 1);
      assert.equal(err.problem.lease_expires_at, first.lease_expires_at);
      assert.ok(err.retryAfterMs >= 1000 && err.retryAfterMs <= 30_000, `retryAfterMs ${err.retryAfterMs}`);
    });

    test('a retryable fail releases the key; a terminal fail is replayed with its response', async () => {
      const key = uniqueKey();
      const first = await idem.begin({ key });
      const released = await idem.fail({ key, lease_token: first.lease_token, error: 'timeout upstream' });
      assert.equal(released.retryable, true);

      const second = await idem.begin({ key });
      assert.equal(second.status, 'acquired');
      assert.equal(second.attempt, 2);
      await idem.fail({
        key,
        lease_token: second.lease_token,
        retryable: false,
        error: 'card declined',
        response: encodeResponse({ statusCode: 402, body: 'declined' }),
      });
      const replay = await idem.begin({ key });
      assert.equal(replay.status, 'failed');
      assert.equal(replay.error, 'card declined');
      assert.equal(replay.attempt, 2);
      assert.deepEqual(decodeResponse(replay.response), { statusCode: 402, body: 'declined' });
    });

    test('fencing: the same token completes twice alike; an earlier attempt\'s token gets lease-lost', async () => {
      const key = uniqueKey();
      const first = await idem.begin({ key, lease_ms: 100 });
      await new Promise((r) => setTimeout(r, 150));
      const second = await idem.begin({ key });
      assert.equal(second.status, 'acquired');
      assert.equal(second.recovered, true);
      assert.equal(second.attempt, 2);

      const stale = await idem.complete({ key, lease_token: first.lease_token }).catch((e) => e);
      assert.equal(stale.kind, 'lease-lost');
      assert.equal(stale.status, 409);

      const done = await idem.complete({ key, lease_token: second.lease_token, response: { body: 'ok' } });
      const again = await idem.complete({ key, lease_token: second.lease_token, response: { body: 'ok' } });
      assert.deepEqual(again, done);
    });

    test('a different fingerprint gets fingerprint-mismatch, whatever the state', async () => {
      const key = uniqueKey();
      await idem.begin({ key, fingerprint: 'sha256:aaa' });
      const err = await idem.begin({ key, fingerprint: 'sha256:bbb' }).catch((e) => e);
      assert.ok(err instanceof IdemError);
      assert.equal(err.kind, 'fingerprint-mismatch');
      assert.equal(err.status, 422);
    });

    test('extend pushes the lease; status and listKeys show the record; delete forgets it', async () => {
      const key = uniqueKey();
      const lease = await idem.begin({ key, owner: 'op-7', lease_ms: 1000 });
      const extended = await idem.extend({ key, lease_token: lease.lease_token, lease_ms: 60_000 });
      assert.ok(Date.parse(extended.lease_expires_at) > Date.parse(lease.lease_expires_at) + 30_000);

      const record = await idem.status(key);
      assert.equal(record.state, 'in_progress');
      assert.equal(record.owner, 'op-7');
      assert.equal(record.tenant, 'ts');
      assert.equal(record.lease_expired, false);
      assert.equal(record.response, undefined);

      const listed = [];
      for await (const r of idem.keys({ state: 'in_progress', limit: 1 })) listed.push(r.key);
      assert.ok(listed.includes(key), `${key} not among ${listed.length} listed`);

      await idem.delete(key);
      await idem.delete(key); // absent: no error
      const gone = await idem.status(key).catch((e) => e);
      assert.equal(gone.kind, 'not-found');
      assert.equal(gone.status, 404);
    });

    test('usage reports the tenant alone, with the bytes it stored and its limits', async () => {
      const key = uniqueKey();
      const lease = await idem.begin({ key });
      await idem.complete({ key, lease_token: lease.lease_token, response: { status_code: 200, body: 'x'.repeat(1000) } });
      let usage;
      const deadline = Date.now() + 5000; // stored bytes reach the store with the next flush (1 s)
      do {
        usage = await idem.usage();
        if (usage[0].stored_bytes >= 1000) break;
        await new Promise((r) => setTimeout(r, 200));
      } while (Date.now() < deadline);
      assert.deepEqual(usage.map((u) => u.tenant), ['ts']);
      assert.ok(usage[0].stored_bytes >= 1000, `stored_bytes ${usage[0].stored_bytes}`);
      assert.deepEqual(usage[0].limits, {});
      assert.equal(usage[0].rejections.begins_per_s, 0);

      const limited = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.limitedKey });
      const [own] = await limited.usage();
      assert.equal(own.tenant, 'limited');
      assert.deepEqual(own.limits, { begins_per_s: 1, burst: 1 });
      const other = await new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.limitedKey, tenant: 'ts' }).usage().catch((e) => e);
      assert.equal(other.kind, 'forbidden');
    });

    test('status includes the stored response when asked, and binary bodies come back byte for byte', async () => {
      const key = uniqueKey();
      const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);
      const lease = await idem.begin({ key });
      await idem.complete({ key, lease_token: lease.lease_token, response: encodeResponse({ statusCode: 200, body: bytes }) });
      const record = await idem.status(key, { includeResponse: true });
      assert.equal(record.state, 'completed');
      assert.equal(record.response.body_encoding, 'base64');
      assert.deepEqual(new Uint8Array(decodeResponse(record.response).body), bytes);
    });

    test('a long failure message is cut to the 1,024 bytes idemsvc takes', async () => {
      const key = uniqueKey();
      const lease = await idem.begin({ key });
      await idem.fail({ key, lease_token: lease.lease_token, retryable: false, error: 'é'.repeat(2000) });
      const record = await idem.status(key);
      assert.equal(record.error, 'é'.repeat(512));
    });

    test('problems are typed: a wrong API key is unauthorized, at once', async () => {
      const wrong = new IdemClient({ baseUrl: svc.baseUrl, apiKey: 'not-a-key' });
      const started = Date.now();
      const err = await wrong.begin({ key: uniqueKey() }).catch((e) => e);
      assert.equal(err.kind, 'unauthorized');
      assert.equal(err.status, 401);
      assert.equal(err.op, 'begin');
      assert.ok(Date.now() - started < 1000, 'a 401 is not retried');
      const bad = await idem.begin({ key: 'has space' }).catch((e) => e);
      assert.equal(bad.kind, 'invalid-request');
      assert.equal(bad.problem.field, 'key');
    });

    test('healthz, readyz and metrics answer', async () => {
      assert.deepEqual(await idem.healthz(), { status: 'ok' });
      assert.deepEqual(await idem.readyz(), { status: 'ok' });
      assert.match(await idem.metrics(), /idemsvc_build_info/);
    });

    test('coalesce: begins and completes asked for together go as one batch each, and answer as single calls', async () => {
      const paths = [];
      const counting = (url, init) => {
        paths.push(new URL(url).pathname);
        return fetch(url, init);
      };
      const together = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey, coalesce: true, fetch: counting });
      const keys = Array.from({ length: 10 }, () => uniqueKey());
      const leases = await Promise.all(keys.map((key) => together.begin({ key, fingerprint: 'f' })));
      assert.deepEqual(paths, ['/v1/begin/batch']);
      assert.deepEqual(leases.map((l) => [l.status, l.key, l.attempt]), keys.map((key) => ['acquired', key, 1]));
      assert.equal(new Set(leases.map((l) => l.lease_token)).size, 10);

      paths.length = 0;
      const done = await Promise.all(
        leases.map((l, i) => together.complete({ key: l.key, lease_token: l.lease_token, response: { status_code: 201, body: `answer ${i}` } })),
      );
      assert.deepEqual(paths, ['/v1/finish/batch']);
      assert.deepEqual(done.map((d) => d.status), Array(10).fill('completed'));

      // Replays come in a batch too; a lone call goes alone.
      paths.length = 0;
      const replays = await Promise.all(keys.map((key) => together.begin({ key, fingerprint: 'f' })));
      assert.deepEqual(replays.map((r) => decodeResponse(r.response).body), keys.map((_, i) => `answer ${i}`));
      await together.begin({ key: uniqueKey() });
      assert.deepEqual(paths, ['/v1/begin/batch', '/v1/begin']);

      // An item the batch does not answer with a success is sent again
      // alone: its error, with Retry-After, is the single call's.
      paths.length = 0;
      const held = uniqueKey();
      await idem.begin({ key: held, owner: 'other', fingerprint: 'f' });
      const [conflict, mismatch, fresh] = await Promise.allSettled([
        together.begin({ key: held, fingerprint: 'f' }),
        together.begin({ key: keys[0], fingerprint: 'other' }),
        together.begin({ key: uniqueKey() }),
      ]);
      assert.equal(conflict.reason.kind, 'in-progress');
      assert.ok(conflict.reason.retryAfterMs > 0, 'the 409 carries its Retry-After');
      assert.equal(mismatch.reason.kind, 'fingerprint-mismatch');
      assert.equal(fresh.value.status, 'acquired');
      assert.deepEqual(paths.sort(), ['/v1/begin', '/v1/begin', '/v1/begin/batch']);

      // Begins that wait go alone: a batch does not wait.
      paths.length = 0;
      await Promise.all([together.begin({ key: uniqueKey(), wait_ms: 100 }), together.begin({ key: uniqueKey(), wait_ms: 100 })]);
      assert.deepEqual(paths, ['/v1/begin', '/v1/begin']);

      // More calls than a batch holds (100) go in as many batches as needed.
      paths.length = 0;
      const many = await Promise.all(Array.from({ length: 150 }, () => together.begin({ key: uniqueKey() })));
      assert.equal(many.filter((l) => l.status === 'acquired').length, 150);
      assert.deepEqual(paths, ['/v1/begin/batch', '/v1/begin/batch']);
    });
  });
}

describe('IdemClient coalesce without batches at idemsvc', () => {
  let svc;
  before(async () => {
    svc = await startOn('memory');
  });
  after(() => svc.stop());

  test('a batch refused as a whole sends its calls alone, and later calls go alone from then on', async () => {
    const paths = [];
    // An idemsvc without batch routes, as an older one: 404 for them.
    const older = (url, init) => {
      const path = new URL(url).pathname;
      paths.push(path);
      if (path.endsWith('/batch')) return Promise.resolve(new Response('404 page not found\n', { status: 404 }));
      return fetch(url, init);
    };
    const idem = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey, coalesce: true, fetch: older });
    const first = await Promise.all([idem.begin({ key: uniqueKey() }), idem.begin({ key: uniqueKey() })]);
    assert.deepEqual(first.map((l) => l.status), ['acquired', 'acquired']);
    assert.deepEqual(paths, ['/v1/begin/batch', '/v1/begin', '/v1/begin']);
    paths.length = 0;
    await Promise.all([idem.begin({ key: uniqueKey() }), idem.begin({ key: uniqueKey() })]);
    assert.deepEqual(paths, ['/v1/begin', '/v1/begin']);
  });

  test('a batch whose answer is lost sends its calls alone, with the same owners; later calls still go together', async () => {
    const paths = [];
    let lose = true;
    // The first batch reaches idemsvc, and its answer is lost.
    const lossy = async (url, init) => {
      const path = new URL(url).pathname;
      paths.push(path);
      const res = await fetch(url, init);
      if (path.endsWith('/batch') && lose) {
        lose = false;
        throw new TypeError('fetch failed');
      }
      return res;
    };
    const idem = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey, coalesce: true, fetch: lossy });
    const keys = [uniqueKey(), uniqueKey()];
    const leases = await Promise.all(keys.map((key) => idem.begin({ key })));
    // Acquired by the lost batch, and given back to the same owner alone.
    assert.deepEqual(leases.map((l) => [l.status, l.attempt]), [['acquired', 1], ['acquired', 1]]);
    assert.deepEqual(paths, ['/v1/begin/batch', '/v1/begin', '/v1/begin']);
    paths.length = 0;
    await Promise.all(leases.map((l) => idem.complete({ key: l.key, lease_token: l.lease_token, response: { body: 'ok' } })));
    assert.deepEqual(paths, ['/v1/finish/batch']);
  });
});

describe('IdemClient retries', () => {
  test('a network error is retried until idemsvc answers', async () => {
    const port = await freePort();
    const idem = new IdemClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: 'x' });
    const late = new Promise((r) => setTimeout(r, 300)).then(() => startIdemsvc({ port }));
    let svc;
    try {
      const err = await new IdemClient({ baseUrl: `http://127.0.0.1:${port}`, retryBudgetMs: 0 }).healthz().catch((e) => e);
      assert.equal(err.kind, 'store-unavailable');
      assert.equal(err.status, 0);
      const answered = await idem.begin({ key: uniqueKey() }).catch((e) => e); // unauthorized: the key is wrong, but idemsvc answered
      svc = await late;
      assert.equal(answered.kind, 'unauthorized');
    } finally {
      svc ??= await late;
      await svc.stop();
    }
  });

  test('429 waits for Retry-After within the budget; past the budget it throws rate-limited', async () => {
    const svc = await startIdemsvc();
    try {
      const limited = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.limitedKey });
      await limited.begin({ key: uniqueKey() }); // the burst of 1
      const short = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.limitedKey, retryBudgetMs: 300 });
      const err = await short.begin({ key: uniqueKey() }).catch((e) => e);
      assert.equal(err.kind, 'rate-limited');
      assert.equal(err.status, 429);
      assert.ok(err.retryAfterMs >= 1000, `retryAfterMs ${err.retryAfterMs}`);

      const started = Date.now();
      const lease = await limited.begin({ key: uniqueKey() });
      assert.equal(lease.status, 'acquired');
      assert.ok(Date.now() - started >= 900, 'waited for Retry-After');
    } finally {
      await svc.stop();
    }
  });

  test('a 503 while Redis hangs is retried with the same owner: the begin that ran unseen is not locked out', async () => {
    const redis = await startRedis();
    const svc = await startIdemsvc({ redisUrl: redis.url });
    try {
      const idem = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey });
      const key = uniqueKey();
      redis.pause();
      setTimeout(() => redis.resume(), 1500);
      const lease = await idem.begin({ key });
      assert.equal(lease.status, 'acquired');
      assert.equal(lease.attempt, 1);
      const record = await idem.status(key);
      assert.match(record.owner, /^idem-ts-[0-9a-f]{32}$/);
    } finally {
      await svc.stop();
      await redis.stop();
    }
  });
});

describe('IdemClient streamed bodies', () => {
  // A server that says what idemsvc's GET /v1/keys/body says (a length and
  // a Repr-Digest) over other bytes: the client's own check must catch it.
  async function serving(body, digestOf, length = body.length) {
    const port = await freePort();
    const server = http.createServer((req, res) => {
      res.writeHead(200, {
        'content-type': 'application/octet-stream',
        'content-length': String(length),
        'repr-digest': `sha-256=:${createHash('sha256').update(digestOf).digest('base64')}:`,
      });
      res.end(body);
    });
    await new Promise((r) => server.listen(port, '127.0.0.1', r));
    return { idem: new IdemClient({ baseUrl: `http://127.0.0.1:${port}`, apiKey: 'x' }), close: () => new Promise((r) => server.close(r)) };
  }

  /** Reads body until it ends or errors: the bytes received and the error. */
  async function drainBody(body) {
    const chunks = [];
    try {
      for await (const chunk of body) chunks.push(chunk);
      return { bytes: Buffer.concat(chunks) };
    } catch (err) {
      return { bytes: Buffer.concat(chunks), err };
    }
  }

  test('openBody errors before the end of a body whose SHA-256 is not the stated one', async () => {
    const right = Buffer.alloc(300_000, 7);
    const wrong = Buffer.from(right);
    wrong[150_000] ^= 1;
    const s = await serving(wrong, right);
    try {
      const { body, size } = await s.idem.openBody('k');
      assert.equal(size, right.length);
      const got = await drainBody(body);
      assert.ok(got.err instanceof BodyMismatchError, `got ${got.err}`);
      assert.ok(got.bytes.length < wrong.length, `${got.bytes.length} bytes of a wrong body of ${wrong.length} came before the error`);
    } finally {
      await s.close();
    }
  });

  test('openBody errors on a body cut short of its Content-Length', async () => {
    const right = Buffer.alloc(100_000, 3);
    const port = await freePort();
    const server = http.createServer((req, res) => {
      res.writeHead(200, { 'content-length': String(right.length) });
      res.write(right.subarray(0, 50_000), () => res.destroy());
    });
    await new Promise((r) => server.listen(port, '127.0.0.1', r));
    try {
      const { body } = await new IdemClient({ baseUrl: `http://127.0.0.1:${port}` }).openBody('k');
      const got = await drainBody(body);
      assert.ok(got.err instanceof BodyMismatchError, `got ${got.err}`);
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  test('openBody passes a sound body whole', async () => {
    const right = Buffer.alloc(200_000, 9);
    const s = await serving(right, right);
    try {
      const { body } = await s.idem.openBody('k');
      const got = await drainBody(body);
      assert.equal(got.err, undefined);
      assert.deepEqual(got.bytes, right);
    } finally {
      await s.close();
    }
  });

  test('completeStream sends a Node Readable and an async iterable, with or without a length', async () => {
    const svc = await startIdemsvc();
    try {
      const idem = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey });
      const bytes = Buffer.alloc(200_000).map((_, i) => i % 251);
      const bodies = [
        [Readable.from([bytes.subarray(0, 70_000), bytes.subarray(70_000)]), undefined],
        [(async function* () { yield bytes.subarray(0, 1); yield bytes.subarray(1); })(), bytes.length],
      ];
      for (const [body, size] of bodies) {
        const lease = await idem.begin({ key: uniqueKey() });
        const done = await idem.completeStream({ key: lease.key, lease_token: lease.lease_token, status_code: 200, size }, body);
        assert.equal(done.status, 'completed');
        const { body: back } = await idem.openBody(lease.key);
        assert.deepEqual((await drainBody(back)).bytes, bytes);
      }
      // A source that fails stores nothing: the key stays in progress.
      const lease = await idem.begin({ key: uniqueKey() });
      const failing = (async function* () { yield bytes; throw new Error('the source broke'); })();
      const err = await idem.completeStream({ key: lease.key, lease_token: lease.lease_token }, failing).then(() => assert.fail('stored'), (e) => e);
      assert.equal(err.kind, 'store-unavailable');
      assert.equal((await idem.status(lease.key)).state, 'in_progress');
    } finally {
      await svc.stop();
    }
  });
});
