// SPDX-License-Identifier: Apache-2.0

// The Express middleware: the shared conformance suite in front of the
// conformance app, then what Express users rely on besides.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import { IdemClient } from '@idemsvc/client';
import { idempotency, keepRawBody } from '@idemsvc/client/express';
import { createApp } from '../../../conformance/app.mjs';
import { conformanceTests } from './conformance.mjs';
import { vectors } from './vectors.mjs';
import { eventually, startIdemsvc, uniqueKey } from './harness.mjs';

let svc;
before(async () => {
  svc = await startIdemsvc();
});
after(() => svc.stop());

/** Serves app on a free loopback port. */
async function serve(app) {
  const server = app.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    port: server.address().port,
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(resolve);
    }),
  };
}

/** The conformance app behind the middleware on client. */
async function conformanceApp(client, { scoped }) {
  const { handler, runs } = createApp();
  const app = express();
  app.use(idempotency(client, scoped ? { scope: (req) => req.headers['x-user'] } : {}));
  app.use((req, res) => handler(req, res));
  return { ...(await serve(app)), runs };
}

describe('Express conformance', () => {
  conformanceTests('express', () => svc, conformanceApp);
});

// The same cases on a client that sends the calls of one turn of the event
// loop as one batch: the duplicates sent together go in batches.
describe('Express conformance, client with coalesce', () => {
  conformanceTests('express-coalesce', () => svc, conformanceApp, { coalesce: true });
});

describe('Express middleware', () => {
  let client;
  before(() => {
    client = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey });
  });

  /** A client whose begin and status calls are counted; after(op, res, init) runs on each answer. */
  function countingClient(after) {
    const calls = { begin: 0, status: 0 };
    const counted = async (input, init) => {
      const op = new URL(String(input)).pathname.slice('/v1/'.length);
      if (op in calls) calls[op]++;
      const res = await fetch(input, init);
      if (after) await after(op, res, init);
      return res;
    };
    return { client: new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey, fetch: counted }), calls };
  }

  test('requests at once on a client with coalesce: their calls go in batches, each runs once, and each duplicate gets its own answer', async () => {
    const paths = [];
    const counting = (url, init) => {
      paths.push(new URL(url).pathname);
      return fetch(url, init);
    };
    const together = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey, coalesce: true, fetch: counting });
    const app = express();
    const runs = new Map();
    app.use(idempotency(together));
    app.post('/orders', express.json(), (req, res) => {
      runs.set(req.body.n, (runs.get(req.body.n) ?? 0) + 1);
      res.status(201).json({ order: req.body.n });
    });
    const server = await serve(app);
    try {
      const keys = Array.from({ length: 32 }, () => uniqueKey());
      const post = (key, n) => fetch(`${server.url}/orders`, {
        method: 'POST',
        headers: { 'Idempotency-Key': `"${key}"`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ n }),
      }).then(async (r) => ({ status: r.status, replayed: r.headers.get('idempotent-replayed'), body: await r.text() }));
      const first = await Promise.all(keys.map((key, n) => post(key, n)));
      assert.deepEqual(first.map((a) => [a.status, a.body]), keys.map((_, n) => [201, JSON.stringify({ order: n })]));
      const again = await Promise.all(keys.map((key, n) => post(key, n)));
      assert.deepEqual(again.map((a) => [a.status, a.replayed, a.body]), keys.map((_, n) => [201, 'true', JSON.stringify({ order: n })]));
      assert.deepEqual([...runs.values()], Array(32).fill(1));
      const batches = paths.filter((p) => p.endsWith('/batch')).length;
      assert.ok(batches > 0, `no batch among ${paths.length} calls`);
      assert.ok(paths.length < 3 * 32, `${paths.length} calls for 3 × 32 of them: few went together`);
    } finally {
      await server.close();
    }
  });

  test('a body parser after the middleware reads the same body, and a duplicate is replayed', async () => {
    const app = express();
    let runs = 0;
    app.use(idempotency(client));
    app.post('/orders', express.json(), (req, res) => {
      runs++;
      res.status(201).json({ got: req.body, run: runs });
    });
    const server = await serve(app);
    try {
      const key = uniqueKey();
      const post = () => fetch(`${server.url}/orders`, {
        method: 'POST',
        headers: { 'Idempotency-Key': `"${key}"`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ amount: 100 }),
      });
      const first = await post();
      assert.equal(first.status, 201);
      assert.deepEqual(await first.json(), { got: { amount: 100 }, run: 1 });
      const second = await post();
      assert.equal(second.headers.get('idempotent-replayed'), 'true');
      assert.deepEqual(await second.json(), { got: { amount: 100 }, run: 1 });
      assert.equal(runs, 1);
    } finally {
      await server.close();
    }
  });

  test('after a body parser that keeps the raw body, the fingerprint is the Go middleware\'s bytes', async () => {
    const app = express();
    app.use(express.text({ type: '*/*', verify: keepRawBody }));
    app.use(idempotency(client));
    app.post('/a%20b/c', (req, res) => {
      assert.equal(res.locals.idempotency.attempt, 1);
      assert.equal(res.locals.idempotency.signal.aborted, false);
      res.status(202).send(`echo ${req.body}`);
    });
    const server = await serve(app);
    try {
      const key = uniqueKey();
      const res = await fetch(`${server.url}/a%20b/c?x=%20y&z`, { method: 'POST', headers: { 'Idempotency-Key': key }, body: 'payload' });
      assert.equal(res.status, 202);
      assert.equal(await res.text(), 'echo payload');
      // Go: method NUL URL.Path (decoded) '?' URL.RawQuery NUL (no credentials) NUL body.
      const want = createHash('sha256').update('POST\0/a b/c?x=%20y&z\0\0payload').digest('hex');
      assert.equal((await client.status(key)).fingerprint, `v2:sha256:${want}`);
      const vector = vectors.requests.find((r) => r.name === 'a path with escapes and a query');
      assert.equal(`v2:sha256:${want}`, vector.fingerprint);
    } finally {
      await server.close();
    }
  });

  test('a thrown error is a 500, not stored: the retry runs the handler again', async () => {
    const app = express();
    let runs = 0;
    app.use(idempotency(client));
    app.post('/boom', () => {
      runs++;
      throw new Error('boom');
    });
    app.use((_err, _req, res, _next) => res.status(500).send('failed')); // Express's own handler would log the error
    const server = await serve(app);
    try {
      const key = uniqueKey();
      for (let i = 0; i < 2; i++) {
        const res = await fetch(`${server.url}/boom`, { method: 'POST', headers: { 'Idempotency-Key': key }, body: 'x' });
        assert.equal(res.status, 500);
        assert.equal(res.headers.get('idempotent-replayed'), null);
      }
      assert.equal(runs, 2);
    } finally {
      await server.close();
    }
  });

  test('once the handler has begun its answer, the response acts as one whose head is out, as without the middleware', async () => {
    const app = express();
    app.set('env', 'test'); // Express's own error handler, without its log line
    const runs = { thrown: 0, restatus: 0, header: 0 };
    app.use(idempotency(client, { leaseMs: 300 }));
    app.post('/thrown', (_req, res) => {
      runs.thrown++;
      res.status(200).write('{"items":[');
      throw Object.assign(new Error('a bad item'), { status: 400 }); // before its head, Express would answer 400 with an error page
    });
    app.post('/restatus', (_req, res) => {
      runs.restatus++;
      res.status(200).write('{"items":[');
      res.status(400).end('a bad item'); // too late: the head said 200
    });
    app.post('/header', (_req, res) => {
      runs.header++;
      res.writeHead(201);
      let thrown;
      try {
        res.setHeader('X-Late', 'yes');
      } catch (err) {
        thrown = err.code;
      }
      res.end(`${res.headersSent} ${thrown}`);
    });
    const server = await serve(app);
    const post = (path, key) => fetch(`${server.url}/${path}`, { method: 'POST', headers: { 'Idempotency-Key': key }, body: 'x' })
      .then(async (res) => ({ status: res.status, body: await res.text(), replayed: res.headers.get('idempotent-replayed'), late: res.headers.get('x-late') }), () => 'cut');
    try {
      // An error after part of the answer: Express cuts the connection,
      // and nothing is stored; the key is released a lease later.
      const key = uniqueKey();
      assert.equal(await post('thrown', key), 'cut');
      await eventually('the key released', async () => (await client.status(key)).state === 'failed', 5000);
      assert.equal(await post('thrown', key), 'cut', 'a retry runs the handler again');
      assert.equal(runs.thrown, 2);

      const restatus = uniqueKey();
      assert.deepEqual(await post('restatus', restatus), { status: 200, body: '{"items":[a bad item', replayed: null, late: null });
      assert.deepEqual(await post('restatus', restatus), { status: 200, body: '{"items":[a bad item', replayed: 'true', late: null });
      assert.equal(runs.restatus, 1);

      assert.deepEqual(await post('header', uniqueKey()), { status: 201, body: 'true ERR_HTTP_HEADERS_SENT', replayed: null, late: null });
    } finally {
      await server.close();
    }
  });

  test('middleware that hook the head, before or after this one, work as they would without it', { timeout: 10_000 }, async () => {
    const app = express();
    // As on-headers (compression, response-time) does: a header set as the head goes out.
    app.use((_req, res, next) => {
      const writeHead = res.writeHead;
      res.writeHead = function (...args) {
        this.setHeader('X-Head-Hook', 'ran');
        return writeHead.apply(this, args);
      };
      next();
    });
    app.use(idempotency(client));
    // As compression before 1.8 does: the head asked for on every write while it is not out.
    app.use((_req, res, next) => {
      const write = res.write;
      res.write = function (...args) {
        if (!this._header) this._implicitHeader();
        return write.apply(this, args);
      };
      next();
    });
    app.post('/small', (_req, res) => {
      res.status(201);
      res.write('a');
      res.write('b');
      res.end('c');
    });
    app.post('/large', (_req, res) => {
      res.status(201);
      res.write(Buffer.alloc(2 << 20, 'a')); // over the 1 MiB held: streamed from here
      res.end('b');
    });
    const server = await serve(app);
    const post = (path, key) => fetch(`${server.url}/${path}`, { method: 'POST', headers: { 'Idempotency-Key': key } })
      .then(async (res) => ({ status: res.status, size: (await res.arrayBuffer()).byteLength, hook: res.headers.get('x-head-hook'), replayed: res.headers.get('idempotent-replayed') }));
    try {
      const small = uniqueKey();
      assert.deepEqual(await post('small', small), { status: 201, size: 3, hook: 'ran', replayed: null });
      assert.deepEqual(await post('small', small), { status: 201, size: 3, hook: 'ran', replayed: 'true' }); // the hook is in front of the replay too
      assert.deepEqual(await post('large', uniqueKey()), { status: 201, size: (2 << 20) + 1, hook: 'ran', replayed: null });
    } finally {
      await server.close();
    }
  });

  test('a caller that leaves does not release the key while the handler runs: the retry gets 409, then the late answer', async () => {
    const app = express();
    let runs = 0;
    let finish;
    const finished = new Promise((resolve) => (finish = resolve));
    app.use(idempotency(client));
    app.post('/slow', async (_req, res) => {
      runs++;
      await finished;
      res.status(201).send('charged once');
    });
    const server = await serve(app);
    try {
      const key = uniqueKey();
      const post = (signal) => fetch(`${server.url}/slow`, { method: 'POST', headers: { 'Idempotency-Key': key }, body: 'x', signal });
      const left = new AbortController();
      const first = post(left.signal).catch(() => 'left');
      await eventually('the handler running', () => runs === 1, 5000);
      left.abort(); // the caller times out and leaves
      assert.equal(await first, 'left');
      await new Promise((resolve) => setTimeout(resolve, 100));
      const retry = await post();
      assert.equal(retry.status, 409, 'the retry must not run the handler while it still runs');
      finish();
      await eventually('the key completed', async () => (await client.status(key)).state === 'completed', 5000);
      const replay = await post();
      assert.equal(replay.status, 201);
      assert.equal(replay.headers.get('idempotent-replayed'), 'true');
      assert.equal(await replay.text(), 'charged once');
      assert.equal(runs, 1);
    } finally {
      finish();
      await server.close();
    }
  });

  test('a handler that never answers its departed caller releases the key a lease later', async () => {
    const app = express();
    let runs = 0;
    app.use(idempotency(client, { leaseMs: 300 }));
    app.post('/never', () => {
      runs++;
    });
    const server = await serve(app);
    try {
      const key = uniqueKey();
      const post = (signal) => fetch(`${server.url}/never`, { method: 'POST', headers: { 'Idempotency-Key': key }, body: 'x', signal });
      const left = new AbortController();
      const first = post(left.signal).catch(() => 'left');
      await eventually('the handler running', () => runs === 1, 5000);
      left.abort();
      await first;
      await eventually('the key released', async () => (await client.status(key)).state === 'failed', 5000);
      const retry = post(AbortSignal.timeout(200)).catch(() => 'timed out');
      await eventually('the handler run again', () => runs === 2, 5000);
      await retry;
    } finally {
      await server.close();
    }
  });

  test('an answer over 1 MiB goes to the caller as it is written, and is replayed without its body', { timeout: 10_000 }, async () => {
    const app = express();
    let received;
    const halfway = new Promise((resolve) => (received = resolve));
    app.use(idempotency(client));
    app.post('/large', async (_req, res) => {
      res.status(201).type('application/octet-stream');
      res.write(Buffer.alloc(2 << 20, 'a'));
      await halfway; // the caller has the first 2 MiB before the handler ends: not held
      res.end(Buffer.alloc(1 << 20, 'b'));
    });
    const server = await serve(app);
    try {
      const key = uniqueKey();
      const first = await fetch(`${server.url}/large`, { method: 'POST', headers: { 'Idempotency-Key': key } });
      assert.equal(first.status, 201);
      let size = 0;
      for await (const chunk of first.body) {
        size += chunk.length;
        if (size >= 2 << 20) received();
      }
      assert.equal(size, 3 << 20);
      await eventually('the key completed', async () => (await client.status(key)).state === 'completed', 5000);
      const replay = await fetch(`${server.url}/large`, { method: 'POST', headers: { 'Idempotency-Key': key } });
      assert.equal(replay.status, 201);
      assert.equal(replay.headers.get('idempotent-replayed'), 'true');
      assert.equal(replay.headers.get('idempotent-body-omitted'), 'true');
      assert.equal(replay.headers.get('content-type'), 'application/octet-stream');
      assert.equal((await replay.arrayBuffer()).byteLength, 0);
    } finally {
      received();
      await server.close();
    }
  });

  test("the middleware's own answers are the Go middleware's bytes", async () => {
    const app = express();
    app.use(idempotency(client));
    app.post('/x', (_req, res) => res.send('never'));
    const server = await serve(app);
    try {
      const res = await fetch(`${server.url}/x`, { method: 'POST', body: 'x' });
      assert.equal(res.status, 400);
      assert.equal(res.headers.get('content-type'), 'application/problem+json');
      assert.equal(
        await res.text(),
        '{"code":"invalid-request","detail":"the Idempotency-Key header is required","status":400,"title":"Invalid request","type":"https://idemsvc.dev/problems/invalid-request"}\n',
      );
    } finally {
      await server.close();
    }
  });
  test("bob, sending alice's key and request, never gets alice's answer; only unscoped hands it over", async () => {
    for (const [name, options, alice, bob, bobStatus] of [
      ['a bearer token', {}, { Authorization: 'Bearer alice' }, { Authorization: 'Bearer bob' }, 422],
      ['a credential cookie', { credentialCookies: ['session'] }, { Cookie: 'theme=dark; session=a' }, { Cookie: 'theme=dark; session=b' }, 422],
      ['a scope from the authentication before', { scope: (req) => req.user }, { Authorization: 'Bearer alice' }, { Authorization: 'Bearer bob' }, 201],
      ['unscoped', { unscoped: true }, { Authorization: 'Bearer alice' }, { Authorization: 'Bearer bob' }, 201],
    ]) {
      const app = express();
      let runs = 0;
      app.use((req, _res, next) => {
        req.user = req.headers.authorization?.slice('Bearer '.length); // the authentication
        next();
      });
      app.use(idempotency(client, options));
      app.post('/orders', (_req, res) => res.status(201).json({ run: ++runs }));
      const server = await serve(app);
      try {
        const key = uniqueKey();
        const post = (headers) =>
          fetch(`${server.url}/orders`, { method: 'POST', headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json', ...headers }, body: '{"a":1}' });
        assert.equal(await (await post(alice)).text(), '{"run":1}', name);
        const res = await post(bob);
        const body = await res.text();
        assert.equal(res.status, bobStatus, `${name}: ${body}`);
        if (name === 'unscoped') {
          assert.equal(body, '{"run":1}', 'unscoped: the stored answer goes to whoever has the key');
        } else {
          assert.notEqual(body, '{"run":1}', `${name}: bob got alice's answer`);
          assert.equal(res.headers.get('idempotent-replayed'), null, name);
        }
        const again = await post(alice);
        assert.equal(again.headers.get('idempotent-replayed'), 'true', name);
        assert.equal(await again.text(), '{"run":1}', name);
      } finally {
        await server.close();
      }
    }
  });

  test('a record stored before fingerprints had a version replays (1 begin + 1 status); with legacyFingerprints: false it gets 422', async () => {
    const key = uniqueKey();
    const body = '{ "amount": 100 }';
    const begun = await client.begin({ key, fingerprint: `sha256:${createHash('sha256').update(`POST\0/orders?\0${body}`).digest('hex')}` });
    await client.complete({ key, lease_token: begun.lease_token, response: { status_code: 201, body: '{"stored":"before"}' } });
    for (const [options, status, want, calls] of [
      [{}, 201, '{"stored":"before"}', { begin: 1, status: 1 }],
      [{ legacyFingerprints: false }, 422, undefined, { begin: 1, status: 0 }],
    ]) {
      const counted = countingClient();
      const app = express();
      app.use(idempotency(counted.client, options));
      app.post('/orders', (_req, res) => res.status(201).send('ran again'));
      const server = await serve(app);
      try {
        const res = await fetch(`${server.url}/orders`, {
          method: 'POST',
          headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json', Authorization: 'Bearer alice' },
          body,
        });
        assert.equal(res.status, status);
        if (want) {
          assert.equal(await res.text(), want);
          assert.equal(res.headers.get('idempotent-replayed'), 'true');
        }
        assert.deepEqual(counted.calls, calls);
      } finally {
        await server.close();
      }
    }
  });

  test('the legacy fingerprint only finds a record, never makes one', async () => {
    const body = '{"amount":100}';
    const legacy = `sha256:${createHash('sha256').update(`POST\0/orders?\0${body}`).digest('hex')}`;
    // Deletes the key of a begin answered 422 before the middleware reads the answer.
    let deleting = false;
    const counted = countingClient(async (op, res, init) => {
      if (deleting && op === 'begin' && res.status === 422) await client.delete(JSON.parse(init.body).key);
    });
    const app = express();
    app.use(idempotency(counted.client));
    app.post('/orders', (_req, res) => res.send('ran'));
    const server = await serve(app);
    const post = (key, user) =>
      fetch(`${server.url}/orders`, { method: 'POST', headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json', Authorization: `Bearer ${user}` }, body });
    try {
      const failed = uniqueKey();
      let begun = await client.begin({ key: failed, fingerprint: legacy });
      await client.fail({ key: failed, lease_token: begun.lease_token, retryable: false, error: 'declined', response: { status_code: 402, body: 'declined before' } });
      let res = await post(failed, 'bob');
      assert.equal(res.status, 402);
      assert.equal(await res.text(), 'declined before');
      assert.equal(res.headers.get('idempotent-replayed'), 'true');

      const running = uniqueKey();
      begun = await client.begin({ key: running, fingerprint: legacy, lease_ms: 30_000 });
      res = await post(running, 'bob');
      assert.equal(res.status, 409, await res.text());
      assert.ok(Number(res.headers.get('retry-after')) >= 1);

      // alice's record: bob, the same request but for his credentials, gets 422 and leaves it as it was.
      const alices = uniqueKey();
      assert.equal(await (await post(alices, 'alice')).text(), 'ran');
      const before = await client.status(alices);
      const calls = { ...counted.calls };
      res = await post(alices, 'bob');
      assert.equal(res.status, 422, await res.text());
      assert.deepEqual(counted.calls, { begin: calls.begin + 1, status: calls.status + 1 });
      const unchanged = await client.status(alices);
      assert.equal(unchanged.fingerprint, before.fingerprint);
      assert.equal(unchanged.attempt, before.attempt);

      // Deleted between bob's begin and the lookup: 422, and no record made with the legacy fingerprint.
      deleting = true;
      res = await post(alices, 'bob');
      assert.equal(res.status, 422, await res.text());
      await assert.rejects(client.status(alices), (err) => err.kind === 'not-found');
    } finally {
      await server.close();
    }
  });

  test('JSON a double does not hold exactly keeps its raw bytes: another account under the same key gets 422', async () => {
    const app = express();
    app.use(idempotency(client));
    app.post('/transfers', (req, res) => req.pipe(res));
    const server = await serve(app);
    const key = uniqueKey();
    const post = (body) => fetch(`${server.url}/transfers`, { method: 'POST', headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json' }, body });
    try {
      assert.equal(await (await post('{"to_account":9007199254740993}')).text(), '{"to_account":9007199254740993}');
      const other = await post('{"to_account":9007199254740992}');
      assert.equal(other.status, 422, await other.text());
      const again = await post('{"to_account":9007199254740993}');
      assert.equal(again.headers.get('idempotent-replayed'), 'true');
    } finally {
      await server.close();
    }
  });

  test('options: methods are taken in upper case; scope with unscoped throws', async () => {
    assert.throws(() => idempotency(client, { scope: () => 'alice', unscoped: true }), /contradict/);
    let runs = 0;
    const app = express();
    app.use(idempotency(client, { methods: ['post'] }));
    app.post('/orders', (_req, res) => res.send(`run ${++runs}`));
    const server = await serve(app);
    try {
      const key = uniqueKey();
      for (let i = 0; i < 2; i++) {
        const res = await fetch(`${server.url}/orders`, { method: 'POST', headers: { 'Idempotency-Key': key } });
        assert.equal(await res.text(), 'run 1');
      }
    } finally {
      await server.close();
    }
  });
});
