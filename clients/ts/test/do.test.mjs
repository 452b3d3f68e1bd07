// SPDX-License-Identifier: Apache-2.0

// doOnce against a real idemsvc, on its in-memory store and on Redis.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import { IdemClient, IdemError, Terminal, terminal, TerminalFailure } from '@idemsvc/client';
import { startOn, stores, uniqueKey } from './harness.mjs';

for (const store of stores) {
  describe(`doOnce on ${store}`, () => {
    let svc;
    let idem;
    before(async () => {
      svc = await startOn(store);
      idem = new IdemClient({ baseUrl: svc.baseUrl, apiKey: svc.apiKey });
    });
    after(() => svc.stop());

    test('runs fn once; a later call replays its response without running it', async () => {
      const key = uniqueKey();
      let runs = 0;
      const fn = () => {
        runs++;
        return { statusCode: 201, headers: { 'Content-Type': 'application/json' }, body: `{"run":${runs}}` };
      };
      const first = await idem.doOnce(key, fn);
      assert.deepEqual(first, { response: { statusCode: 201, headers: { 'Content-Type': 'application/json' }, body: '{"run":1}' }, replayed: false, attempt: 1 });
      const second = await idem.doOnce(key, fn);
      assert.deepEqual(second, { ...first, replayed: true });
      assert.equal(runs, 1);
    });

    test('a binary body is stored in base64 and replayed as the same bytes', async () => {
      const key = uniqueKey();
      const bytes = Uint8Array.from({ length: 300 }, (_, i) => (i * 7) & 0xff);
      await idem.doOnce(key, () => ({ body: bytes }));
      const replay = await idem.doOnce(key, () => assert.fail('ran again'));
      assert.ok(replay.body === undefined && replay.response.body instanceof Uint8Array);
      assert.deepEqual(new Uint8Array(replay.response.body), bytes);
      assert.equal((await idem.status(key, { includeResponse: true })).response.body_encoding, 'base64');
    });

    test('concurrent duplicates run fn once and all get its outcome', async () => {
      const key = uniqueKey();
      let runs = 0;
      const fn = async () => {
        runs++;
        await delay(300);
        return { body: 'charged' };
      };
      const results = await Promise.all(Array.from({ length: 6 }, () => idem.doOnce(key, fn)));
      assert.equal(runs, 1);
      assert.deepEqual(results.map((r) => r.response.body), Array(6).fill('charged'));
      assert.equal(results.filter((r) => r.replayed).length, 5);
    });

    test("the caller's signal reaches fn, but the lease is kept while fn still runs", async () => {
      const key = uniqueKey();
      const caller = new AbortController();
      let runs = 0;
      const fn = async (signal) => {
        runs++;
        if (runs === 1) {
          caller.abort();
          assert.ok(signal.aborted, "fn's signal fires with the caller's");
          await delay(900); // fn ignores it and goes on, past the 300 ms lease
        }
        return { body: `run ${runs}` };
      };
      const first = idem.doOnce(key, fn, { leaseMs: 300, signal: caller.signal }).then((r) => r, (e) => e);
      await delay(500);
      // The lease, extended while fn runs, still holds the key.
      const second = await idem.doOnce(key, fn, { waitMs: 2000 });
      assert.equal(runs, 1);
      assert.equal(second.response.body, 'run 1');
      assert.equal((await first).response?.body ?? (await first).message, 'run 1');
    });

    test('a Terminal wrapped in another error is still terminal', async () => {
      const key = uniqueKey();
      const err = await idem.doOnce(key, () => {
        throw new Error('wrapped', { cause: terminal(new Error('card declined')) });
      }).catch((e) => e);
      assert.ok(err instanceof TerminalFailure, String(err));
      assert.equal((await idem.status(key)).state, 'failed');
      assert.equal((await idem.status(key)).retryable, false);
    });

    test('a Terminal error is stored: later calls get the same TerminalFailure, replayed', async () => {
      const key = uniqueKey();
      const declined = new Error('card declined');
      const err = await idem.doOnce(key, () => {
        throw new Terminal(declined, { statusCode: 402, body: 'declined' });
      }).catch((e) => e);
      assert.ok(err instanceof TerminalFailure);
      assert.equal(err.replayed, false);
      assert.equal(err.cause.cause, declined);
      assert.deepEqual(err.response, { statusCode: 402, body: 'declined' });

      const again = await idem.doOnce(key, () => assert.fail('ran again')).catch((e) => e);
      assert.ok(again instanceof TerminalFailure);
      assert.equal(again.replayed, true);
      assert.equal(again.message, 'idem: failed terminally: card declined');
      assert.deepEqual(again.response, { statusCode: 402, body: 'declined' });
      assert.equal(again.attempt, 1);

      const bare = uniqueKey(); // terminal() without a response
      await idem.doOnce(bare, () => Promise.reject(terminal('gone'))).catch(() => undefined);
      assert.equal((await idem.status(bare)).retryable, false);
    });

    test('any other error releases the key and is thrown as is; the next call runs fn again', async () => {
      const key = uniqueKey();
      const boom = new Error('upstream timed out');
      const err = await idem.doOnce(key, () => Promise.reject(boom)).catch((e) => e);
      assert.equal(err, boom);
      const second = await idem.doOnce(key, () => ({ body: 'ok' }));
      assert.equal(second.replayed, false);
      assert.equal(second.attempt, 2);
    });

    test('the lease is extended while fn runs, so nobody takes it over', async () => {
      const key = uniqueKey();
      let signal;
      const running = idem.doOnce(key, async (s) => {
        signal = s;
        await delay(1200);
        return { body: 'slow' };
      }, { leaseMs: 300 });
      await delay(800); // the lease of 300 ms would have run out twice
      const other = await idem.begin({ key }).catch((e) => e);
      assert.ok(other instanceof IdemError, `another caller got ${JSON.stringify(other)}`);
      assert.equal(other.kind, 'in-progress');
      const result = await running;
      assert.equal(result.attempt, 1);
      assert.equal(signal.aborted, false);
    });

    test("fn's signal fires with lease-lost when the lease is lost, and doOnce throws it", async () => {
      const key = uniqueKey();
      const running = idem.doOnce(key, (signal) => new Promise((_, reject) => {
        signal.addEventListener('abort', () => reject(signal.reason));
      }), { leaseMs: 300 });
      await delay(50);
      await idem.delete(key); // an operator forgets the record: the next extend finds no lease
      const started = Date.now();
      const err = await running.catch((e) => e);
      assert.ok(err instanceof IdemError);
      assert.equal(err.kind, 'lease-lost');
      assert.ok(Date.now() - started < 1000, 'noticed at the next heartbeat');
    });

    test('a different fingerprint for the same key throws fingerprint-mismatch without running fn', async () => {
      const key = uniqueKey();
      await idem.doOnce(key, () => ({ body: 'a' }), { fingerprint: 'sha256:a' });
      const err = await idem.doOnce(key, () => assert.fail('ran'), { fingerprint: 'sha256:b' }).catch((e) => e);
      assert.equal(err.kind, 'fingerprint-mismatch');
    });

    test('waiting for an attempt held elsewhere ends with the caller\'s signal', async () => {
      const key = uniqueKey();
      await idem.begin({ key, lease_ms: 30_000 }); // held, never finished
      const started = Date.now();
      const err = await idem.doOnce(key, () => assert.fail('ran'), { waitMs: 100, signal: AbortSignal.timeout(400) }).catch((e) => e);
      assert.equal(err.name, 'TimeoutError');
      assert.ok(Date.now() - started < 2000);
    });
  });
}
