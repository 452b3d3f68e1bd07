// SPDX-License-Identifier: Apache-2.0

// Compiled with tsc --strict --noEmit (npm run typecheck), never run: the
// package's types read as a TypeScript user expects. Optional request
// fields are optional, integers are numbers, problem kinds are string
// literals, and each entry point's types resolve through the exports map.
import express from 'express';
import Fastify from 'fastify';
import { IdemClient, IdemError, Terminal, TerminalFailure, type BeginParams, type ProblemKind } from '@idemsvc/client';
import { idempotency as expressIdempotency } from '@idemsvc/client/express';
import { idempotency as fastifyIdempotency } from '@idemsvc/client/fastify';

const idem = new IdemClient({ baseUrl: 'http://127.0.0.1:8080', apiKey: 'key' });

export async function usage(): Promise<number> {
  // Only the key is required.
  const minimal: BeginParams = { key: 'order-1' };
  const res = await idem.begin(minimal);
  let attempt: number = res.attempt; // an integer is a number, not a bigint
  if (res.status === 'acquired') {
    const token: string = res.lease_token;
    const lease = await idem.extend({ key: res.key, lease_token: token });
    const expires: string = lease.lease_expires_at;
    void expires;
    await idem.complete({ key: res.key, lease_token: token, response: { status_code: 201 } });
  } else {
    const body: string | undefined = res.response.body;
    void body;
  }
  // @ts-expect-error lease_ms is a number
  await idem.begin({ key: 'k', lease_ms: '100' });
  // @ts-expect-error the key is required
  await idem.begin({ owner: 'me' });

  try {
    const out = await idem.doOnce('job-7', async (signal) => {
      signal.throwIfAborted();
      if (Math.random() < 0.1) throw new Terminal(new Error('refused'), { statusCode: 422 });
      return { statusCode: 200, body: new Uint8Array([1, 2, 3]) };
    }, { leaseMs: 10_000, waitMs: 1_000 });
    attempt = out.attempt;
  } catch (err) {
    if (err instanceof IdemError) {
      const kind: ProblemKind = err.kind;
      switch (kind) {
        case 'in-progress':
        case 'lease-lost':
          return err.retryAfterMs ?? 0;
        // @ts-expect-error not a kind idemsvc answers
        case 'no-such-kind':
          return -1;
        default:
          return err.status;
      }
    }
    if (err instanceof TerminalFailure) return err.attempt;
  }

  const app = express();
  app.use(expressIdempotency(idem, { methods: ['POST'], waitMs: 2_000 }));
  // A scope from the authentication before the middleware.
  app.use(expressIdempotency(idem, { scope: (req: express.Request) => req.get('x-user'), credentialCookies: ['session'] }));
  app.use(expressIdempotency(idem, { unscoped: true, legacyFingerprints: false, credentialSecret: 'shared secret' }));
  app.post('/charges', (_req, res) => {
    const attemptOfRequest = (res.locals.idempotency as { attempt: number } | undefined)?.attempt;
    res.status(201).json({ attemptOfRequest });
  });

  const server = Fastify();
  await server.register(fastifyIdempotency, { client: idem, headers: ['Content-Type', 'Location'] });
  await server.register(fastifyIdempotency, { client: idem, scope: (request) => String(request.headers['x-user'] ?? '') });
  server.post('/charges', async (request) => ({ attempt: request.idempotency?.attempt }));
  return attempt;
}
