/**
 * A Fastify plugin that makes routes idempotent per the Idempotency-Key
 * header draft; see {@link idempotency}.
 *
 * @module
 */
import { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { IdemClient } from './client.js';
import { runUnderLease } from './do.js';
import {
  abandonAfterLease,
  problemAnswer,
  releaseForGoneCaller,
  beginErrorAnswer,
  beginRequest,
  fingerprint,
  keyProblem,
  NotStored,
  parseKey,
  replayAnswer,
  retryAgain,
  settingsOf,
  storedResponse,
  tooLargeAnswer,
  type Answer,
  type IdempotencyOptions,
  type Settings,
} from './middleware.js';

export { REPLAYED_HEADER, type IdempotencyOptions } from './middleware.js';
export { BODY_OMITTED_HEADER } from './do.js';

/** The plugin's options: the client, and the middleware's options. */
export interface IdempotencyPluginOptions extends IdempotencyOptions {
  client: IdemClient;
}

/** What the plugin tells the handler of a request it runs under a lease (`request.idempotency`). */
export interface IdempotencyContext {
  key: string;
  /** The attempt, strictly increasing per key: a fencing token for the handler's own storage. */
  attempt: number;
  /** Fires when the lease is lost: another request may now run the handler for this key. */
  signal: AbortSignal;
}

declare module 'fastify' {
  interface FastifyRequest {
    /** Set while the idempotency plugin runs the handler under a lease; null otherwise. */
    idempotency: IdempotencyContext | null;
  }
}

/** A request on its way through the plugin. */
interface Pending {
  key: string;
  fingerprint: string;
  /** Set once the key is acquired: the handler's answer, and the run that stores it. */
  answer?: Deferred<{ status: number; body: Buffer }>;
  run?: Promise<unknown>;
}

const pending = new WeakMap<FastifyRequest, Pending>();

/**
 * Makes the routes of the scope it is registered in idempotent, per the
 * Idempotency-Key header draft, as the Go SDK's middleware and the Express
 * middleware do (see `@idemsvc/client/express` for the rules). It reads the
 * raw body in a preParsing hook (for the fingerprint) and hands it on to
 * the content-type parsers unchanged, begins the key in a preHandler hook,
 * and stores the answer in an onSend hook before it is sent. A reply the
 * handler hijacks is not stored: once its connection closes, the attempt
 * fails retryably within a lease (the handler may still be running), as
 * when the caller leaves before the answer.
 *
 * @example
 * import Fastify from 'fastify';
 * import { IdemClient } from '@idemsvc/client';
 * import { idempotency } from '@idemsvc/client/fastify';
 *
 * const app = Fastify();
 * await app.register(idempotency, { client: new IdemClient({ baseUrl: 'http://idemsvc:8080', apiKey }) });
 * app.post('/charges', async (request, reply) => reply.code(201).send(charge(request.body)));
 */
export function idempotency(fastify: FastifyInstance, options: IdempotencyPluginOptions, done: (err?: Error) => void): void {
  const { client, ...rest } = options;
  const settings = settingsOf(rest);
  if (!fastify.hasRequestDecorator('idempotency')) fastify.decorateRequest('idempotency', null);

  fastify.addHook('preParsing', async (request: FastifyRequest, reply: FastifyReply, payload: Readable) => {
    if (!settings.methods.has(request.method)) return payload; // not made idempotent: runs every time
    const header = request.headers[settings.keyHeaderLower];
    if (header === undefined) {
      if (settings.optional) return payload;
      return send(reply, keyProblem(settings, true));
    }
    const key = parseKey(header);
    if (key === undefined) return send(reply, keyProblem(settings, false));
    const body = await readBody(payload, settings.maxBodyBytes, request.headers['content-length']);
    if (body === undefined) return send(reply, tooLargeAnswer());
    pending.set(request, { key, fingerprint: fingerprint(request.method, request.raw.url ?? request.url, body) });
    const again = Readable.from(body.length > 0 ? [body] : []);
    (again as Readable & { receivedEncodedLength?: number }).receivedEncodedLength = body.length;
    return again;
  });

  fastify.addHook('preHandler', async (request: FastifyRequest, reply: FastifyReply) => {
    const p = pending.get(request);
    if (p === undefined) return;
    await begin(client, settings, p, request, reply);
  });

  fastify.addHook('onSend', async (request: FastifyRequest, reply: FastifyReply, payload: unknown) => {
    const p = pending.get(request);
    if (p?.answer === undefined) return payload;
    const body = await bytesOf(payload);
    p.answer.resolve({ status: reply.statusCode, body });
    await p.run;
    return typeof payload === 'string' || Buffer.isBuffer(payload) ? payload : body;
  });

  done();
}

// Hooks apply to the scope that registers the plugin, as fastify-plugin
// would have it, without depending on fastify-plugin.
Object.assign(idempotency, {
  [Symbol.for('skip-override')]: true,
  [Symbol.for('fastify.display-name')]: '@idemsvc/client/fastify',
});

export default idempotency;

async function begin(client: IdemClient, settings: Settings, p: Pending, request: FastifyRequest, reply: FastifyReply): Promise<void> {
  const requestId = request.headers['x-request-id'];
  let begun;
  try {
    begun = await beginRequest(client, settings, p.key, p.fingerprint, typeof requestId === 'string' ? requestId : undefined);
  } catch (err) {
    pending.delete(request);
    return send(reply, beginErrorAnswer(err));
  }
  if (begun.status !== 'acquired') {
    pending.delete(request);
    return send(reply, replayAnswer(begun));
  }
  if (reply.raw.destroyed || request.raw.socket.destroyed) {
    // The caller left while the key was being begun: nothing runs for it.
    pending.delete(request);
    await releaseForGoneCaller(client, begun);
    return send(reply, problemAnswer('internal', 'the caller left before the handler ran'));
  }
  const answer = deferred<{ status: number; body: Buffer }>();
  p.answer = answer;
  reply.raw.on('close', () => {
    if (!answer.settled) abandonAfterLease(settings.leaseMs, answer.promise, answer.reject);
  });
  p.run = runUnderLease(client, begun, { leaseMs: settings.leaseMs, retentionS: settings.retentionS, omitBody: true }, async (signal) => {
    const context: IdempotencyContext = { key: p.key, attempt: begun.attempt, signal };
    request.idempotency = context;
    const { status, body } = await answer.promise;
    const response = storedResponse(status, (name) => reply.getHeader(name), body, settings);
    if (retryAgain(status)) throw new NotStored(status);
    return response;
  }).catch(() => undefined); // the handler ran: its caller gets its answer, stored or not
}

/** The payload as bytes, up to limit; undefined past it. */
async function readBody(payload: Readable, limit: number, contentLength: string | undefined): Promise<Buffer | undefined> {
  if (Number(contentLength) > limit) return undefined;
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of payload) {
    const b = typeof chunk === 'string' ? Buffer.from(chunk) : (chunk as Buffer);
    size += b.length;
    if (size > limit) return undefined;
    chunks.push(b);
  }
  return chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size);
}

/** The bytes of an onSend payload: a string, a Buffer, a stream, or nothing. */
async function bytesOf(payload: unknown): Promise<Buffer> {
  if (payload === undefined || payload === null) return Buffer.alloc(0);
  if (typeof payload === 'string') return Buffer.from(payload);
  if (Buffer.isBuffer(payload)) return payload;
  if (payload instanceof Uint8Array) return Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
  if (payload instanceof Readable) {
    const chunks: Buffer[] = [];
    for await (const chunk of payload) chunks.push(typeof chunk === 'string' ? Buffer.from(chunk) : (chunk as Buffer));
    return Buffer.concat(chunks);
  }
  return Buffer.from(String(payload));
}

/**
 * Sends an answer of the plugin's own; the hook chain stops there. The body
 * goes as bytes, which Fastify sends as they are: given a string, it would
 * add a charset to a JSON content type.
 */
function send(reply: FastifyReply, answer: Answer): FastifyReply {
  const body = typeof answer.body === 'string' ? Buffer.from(answer.body) : answer.body;
  return reply.code(answer.status).headers(answer.headers).send(body);
}

interface Deferred<T> {
  promise: Promise<T>;
  resolve: (value: T) => void;
  reject: (err: Error) => void;
  /** Whether resolve or reject was called. */
  settled: boolean;
}

function deferred<T>(): Deferred<T> {
  const d = { settled: false } as Deferred<T>;
  d.promise = new Promise<T>((res, rej) => {
    d.resolve = (value) => ((d.settled = true), res(value));
    d.reject = (err) => ((d.settled = true), rej(err));
  });
  d.promise.catch(() => undefined); // a broken connection is handled by the run
  return d;
}
