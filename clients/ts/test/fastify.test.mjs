// SPDX-License-Identifier: Apache-2.0

// The Fastify plugin: the shared conformance suite in front of the
// conformance app (written on Fastify's reply, as the plugin sees only
// replies sent through Fastify), then what Fastify users rely on besides.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import { createHash } from 'node:crypto';
import Fastify from 'fastify';
import { IdemClient } from '@idemsvc/client';
import { idempotency } from '@idemsvc/client/fastify';
import { LARGE_BYTES } from '../../../conformance/app.mjs';
import { conformanceTests } from './conformance.mjs';
import { startIdemsvc, uniqueKey } from './harness.mjs';

let svc;
before(async () => {
  svc = await startIdemsvc();
});
after(() => svc.stop());

/**
 * The conformance app of conformance/README.md on Fastify: every request
 * counts as one run, its body read in full (any content type, invalid JSON too), and it
 * answers by path. /crash throws, as the README has it for Fastify.
 */
function conformanceApp(app) {
  let runs = 0;
  // Every body as bytes, JSON too: the app takes whatever it is sent.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
  app.all('/*', async (request, reply) => {
    const run = ++runs;
    const [, route, arg] = new URL(request.url, 'http://app').pathname.split('/');
    switch (route) {
      case 'answer':
        return answer(reply, Number(arg), run);
      case 'slow':
        await delay(Number(arg));
        return answer(reply, 201, run);
      case 'binary': {
        const body = Buffer.alloc(260);
        for (let i = 0; i < 256; i++) body[i] = i;
        body.writeUInt32BE(run, 256);
        return reply.code(200).header('Content-Type', 'application/octet-stream').send(body);
      }
      case 'large':
        return reply.code(200).header('Content-Type', 'text/plain').send(Buffer.alloc(LARGE_BYTES, 'a'));
      case 'crash':
        throw new Error('crash');
      default:
        return reply.code(404).header('Content-Type', 'text/plain').send('no such route\n');
    }
  });
  return () => runs;
}

function answer(reply, status, run) {
  return reply
    .code(status)
    .headers({ 'Content-Type': 'application/json', Location: '/things/1', 'X-Run': String(run) })
    .send(Buffer.from(JSON.stringify({ run }))); // bytes: a string would get a charset added
}

/** A Fastify server with the plugin registered, routes added by routes(app), on a free loopback port. */
async function serve(client, routes, options) {
  const app = Fastify({ forceCloseConnections: true });
  // The authentication, before the plugin's preHandler: a scope may read it.
  app.decorateRequest('user', null);
  app.addHook('onRequest', async (request) => {
    request.user = request.headers.authorization?.slice('Bearer '.length) ?? null;
  });
  await app.register(idempotency, { client, ...options });
  const runs = routes(app);
  await app.listen({ port: 0, host: '127.0.0.1' });
  const { port } = app.server.address();
  return { port, url: `http://127.0.0.1:${port}`, runs, close: () => app.close() };
}

describe('Fastify conformance', () => {
  conformanceTests('fastify', () => svc, (client, { scoped }) =>
    serve(client, conformanceApp, scoped ? { scope: (request) => request.headers['x-user'] } : {}),
  );
});

describe('Fastify plugin', () => {
  let client;
  before(() => {
    client = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey });
  });

  test('JSON routes get their parsed body; a duplicate is replayed; request.idempotency is set', async () => {
    let runs = 0;
    const server = await serve(client, (app) => {
      app.post('/orders', async (request, reply) => {
        runs++;
        assert.equal(request.idempotency.attempt, 1);
        assert.equal(request.idempotency.signal.aborted, false);
        return reply.code(201).send({ got: request.body, run: runs });
      });
    });
    try {
      const key = uniqueKey();
      const post = () => fetch(`${server.url}/orders`, {
        method: 'POST',
        headers: { 'Idempotency-Key': `"${key}"`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ amount: 100 }),
      });
      const first = await post();
      assert.equal(first.status, 201);
      const firstBody = await first.text();
      assert.deepEqual(JSON.parse(firstBody), { got: { amount: 100 }, run: 1 });
      const second = await post();
      assert.equal(second.status, 201);
      assert.equal(second.headers.get('idempotent-replayed'), 'true');
      assert.equal(second.headers.get('content-type'), 'application/json; charset=utf-8');
      assert.equal(await second.text(), firstBody);
      assert.equal(runs, 1);
    } finally {
      await server.close();
    }
  });

  test('a handler that breaks the connection is run again on retry, once its lease has run', async () => {
    let runs = 0;
    const server = await serve(client, (app) => {
      app.post('/crash', (request, reply) => {
        runs++;
        request.raw.socket.destroy();
        reply.hijack();
      });
    }, { leaseMs: 300 });
    try {
      const key = uniqueKey();
      const post = () => fetch(`${server.url}/crash`, { method: 'POST', headers: { 'Idempotency-Key': key }, body: 'x' }).catch(() => undefined);
      await post();
      // The handler may still be running: the key stays held for a lease.
      assert.equal((await post())?.status, 409);
      await delay(600);
      await post();
      assert.equal(runs, 2);
    } finally {
      await server.close();
    }
  });

  test('a streamed answer is stored and replayed byte for byte', async () => {
    const server = await serve(client, (app) => {
      app.post('/stream', async (_request, reply) => {
        const { Readable } = await import('node:stream');
        return reply.header('Content-Type', 'text/plain').send(Readable.from(['a', 'b', 'c']));
      });
    });
    try {
      const key = uniqueKey();
      const post = () => fetch(`${server.url}/stream`, { method: 'POST', headers: { 'Idempotency-Key': key } });
      assert.equal(await (await post()).text(), 'abc');
      const replay = await post();
      assert.equal(replay.headers.get('idempotent-replayed'), 'true');
      assert.equal(await replay.text(), 'abc');
    } finally {
      await server.close();
    }
  });

  test('options: other methods, another header, optional keys', async () => {
    let runs = 0;
    const server = await serve(client, (app) => {
      app.put('/things', async () => ({ run: ++runs }));
      app.post('/things', async () => ({ run: ++runs }));
    }, { methods: ['PUT'], keyHeader: 'X-Request-Key', optional: true });
    try {
      const key = uniqueKey();
      const put = () => fetch(`${server.url}/things`, { method: 'PUT', headers: { 'X-Request-Key': key } });
      assert.deepEqual(await (await put()).json(), { run: 1 });
      assert.deepEqual(await (await put()).json(), { run: 1 });
      assert.equal((await fetch(`${server.url}/things`, { method: 'PUT' })).status, 200); // optional: runs
      assert.equal((await fetch(`${server.url}/things`, { method: 'POST', headers: { 'X-Request-Key': key } })).status, 200);
      assert.equal(runs, 3);
    } finally {
      await server.close();
    }
  });
  test("bob never gets alice's answer: a scope read from what an onRequest hook authenticated, or the credentials' digest", async () => {
    for (const [options, bobStatus] of [[{ scope: (request) => request.user }, 201], [{}, 422]]) {
      let runs = 0;
      const server = await serve(client, (app) => {
        app.post('/orders', async (_request, reply) => reply.code(201).send({ run: ++runs }));
      }, options);
      try {
        const key = uniqueKey();
        const post = (user) =>
          fetch(`${server.url}/orders`, {
            method: 'POST',
            headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json', Authorization: `Bearer ${user}` },
            body: '{"a":1}',
          });
        assert.deepEqual(await (await post('alice')).json(), { run: 1 });
        const res = await post('bob');
        const body = await res.text();
        assert.equal(res.status, bobStatus, body);
        assert.notEqual(body, '{"run":1}', "bob got alice's answer");
        assert.equal(res.headers.get('idempotent-replayed'), null);
        assert.equal(await (await post('alice')).text(), '{"run":1}');
      } finally {
        await server.close();
      }
    }
  });

  test('scope with unscoped is refused at registration', async () => {
    await assert.rejects(serve(client, () => {}, { scope: () => 'alice', unscoped: true }), /contradict/);
  });

  test('a record stored before fingerprints had a version replays', async () => {
    const key = uniqueKey();
    const body = '{"amount":100}';
    const begun = await client.begin({ key, fingerprint: `sha256:${createHash('sha256').update(`POST\0/orders?\0${body}`).digest('hex')}` });
    await client.complete({ key, lease_token: begun.lease_token, response: { status_code: 201, body: '{"stored":"before"}' } });
    const server = await serve(client, (app) => {
      app.post('/orders', async (_request, reply) => reply.code(201).send('ran again'));
    });
    try {
      const res = await fetch(`${server.url}/orders`, { method: 'POST', headers: { 'Idempotency-Key': key, 'Content-Type': 'application/json' }, body });
      assert.equal(res.status, 201);
      assert.equal(res.headers.get('idempotent-replayed'), 'true');
      assert.equal(await res.text(), '{"stored":"before"}');
    } finally {
      await server.close();
    }
  });
});
