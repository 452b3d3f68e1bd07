// SPDX-License-Identifier: Apache-2.0

/**
 * A Fastify plugin that makes routes idempotent per the Idempotency-Key
 * header draft; see {@link idempotency}.
 *
 * @module
 */
import { once } from 'node:events';
import { PassThrough, pipeline, Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { BeginAcquired, IdemClient } from './client.js';
import {
  acquire,
  identify,
  keyProblem,
  MAX_HELD_BODY_BYTES,
  parseKey,
  settingsOf,
  startBodyStream,
  storeAnswer,
  tooLargeAnswer,
  type Answer,
  type IdempotencyContext,
  type IdempotencyOptions,
  type BodyStream,
  type PendingAnswer,
  type Settings,
} from './middleware.js';

export { REPLAYED_HEADER, type IdempotencyContext, type IdempotencyOptions } from './middleware.js';
export { BODY_OMITTED_HEADER } from './do.js';

/** The plugin's options: the client, and the middleware's options. */
export interface IdempotencyPluginOptions extends IdempotencyOptions<FastifyRequest> {
  client: IdemClient;
}

declare module 'fastify' {
  interface FastifyRequest {
    /** Set while the idempotency plugin runs the handler under a lease; null otherwise. */
    idempotency: IdempotencyContext | null;
  }
}

/** A request on its way through the plugin. */
interface Pending {
  /** The client's key, and the request body read for the fingerprint. */
  key: string;
  body: Buffer;
  /** Set once the key is acquired: the handler's answer, and the run that stores it. */
  answer?: PendingAnswer;
  run?: Promise<unknown>;
  lease?: BeginAcquired;
}

const pending = new WeakMap<FastifyRequest, Pending>();

/**
 * Makes the routes of the scope it is registered in idempotent, per the
 * Idempotency-Key header draft, as the Go SDK's middleware and the Express
 * middleware do (see `@idemsvc/client/express` for the rules). It reads the
 * raw body in a preParsing hook (for the fingerprint) and hands it on to
 * the content-type parsers unchanged, begins the key in a preHandler hook
 * (where `scope` reads what the authenticating hooks before it set), and
 * stores the answer in an onSend hook before it is sent (an answer over
 * 1 MiB is sent as it comes instead, and stored beside it with
 * `maxStreamedBodyBytes`, or without its body; a replay kept by reference
 * is streamed to the hijacked reply). A reply the
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
  let settings: Settings;
  try {
    settings = settingsOf(client, rest);
  } catch (err) {
    done(err as Error); // invalid options: register rejects
    return;
  }
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
    pending.set(request, { key, body });
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
    if (p?.answer === undefined || p.lease === undefined) return payload;
    const answer = p.answer;
    const status = reply.statusCode;
    const header = (name: string) => reply.getHeader(name);
    if (payload instanceof Readable) {
      const held = await holdUpTo(payload, MAX_HELD_BODY_BYTES);
      if (held.rest !== undefined) {
        // Too large to hold: it goes to the caller as it comes, and to
        // idemsvc beside (maxStreamedBodyBytes) or stored without it.
        const out = new PassThrough({ highWaterMark: 64 << 10 });
        const stream = startBodyStream(client, settings, p.lease, answer, status, header);
        void pump(held.chunks, held.rest, out, stream).then(
          () => answer.resolve({ status, body: Buffer.alloc(0), streamed: true }),
          (err: Error) => {
            out.destroy(err); // a broken answer, never taken for a whole one
            answer.reject(err);
          },
        );
        return out;
      }
      payload = held.chunks.length === 1 ? held.chunks[0]! : Buffer.concat(held.chunks);
    }
    const body = bytesOf(payload);
    if (body.length > MAX_HELD_BODY_BYTES) {
      // Held by the handler already: sent to idemsvc as it is
      // (maxStreamedBodyBytes), or stored without it.
      const stream = startBodyStream(client, settings, p.lease, answer, status, header);
      if (stream !== undefined) stream.write(body);
      answer.resolve({ status, body: Buffer.alloc(0), streamed: true });
    } else {
      answer.resolve({ status, body, streamed: false });
    }
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
  // In preHandler, after the hooks that authenticate, which the scope reads.
  const scope = settings.scope as ((request: FastifyRequest) => string | undefined | null) | undefined;
  const id = identify(settings, p.key, request.method, request.raw.url ?? request.url, request.headers, p.body, () => scope?.(request));
  if (!('fingerprint' in id)) {
    pending.delete(request);
    return send(reply, id);
  }
  const lease = await acquire(client, settings, id, request.headers['x-request-id'], reply.raw);
  if (!('lease_token' in lease)) {
    pending.delete(request);
    return send(reply, lease);
  }
  const { answer, stored } = storeAnswer(client, settings, lease, reply.raw, (name) => reply.getHeader(name), (context) => {
    request.idempotency = context;
  });
  p.answer = answer;
  p.run = stored;
  p.lease = lease;
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

/** The bytes of an onSend payload that is not a stream: a string, a Buffer, or nothing. */
function bytesOf(payload: unknown): Buffer {
  if (payload === undefined || payload === null) return Buffer.alloc(0);
  if (typeof payload === 'string') return Buffer.from(payload);
  if (Buffer.isBuffer(payload)) return payload;
  if (payload instanceof Uint8Array) return Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
  return Buffer.from(String(payload));
}

/** A chunk of a stream as bytes. */
function chunkOf(chunk: unknown): Buffer {
  return typeof chunk === 'string' ? Buffer.from(chunk) : Buffer.isBuffer(chunk) ? chunk : bytesOf(chunk);
}

/**
 * Reads a stream payload up to limit bytes: the chunks read, and, when it
 * has more than limit, the iterator of the rest (the chunk that crossed
 * the limit is among the chunks).
 */
async function holdUpTo(payload: Readable, limit: number): Promise<{ chunks: Buffer[]; rest?: AsyncIterator<unknown> }> {
  const chunks: Buffer[] = [];
  let size = 0;
  const it = payload[Symbol.asyncIterator]();
  for (;;) {
    const next = await it.next();
    if (next.done) return { chunks };
    const b = chunkOf(next.value);
    chunks.push(b);
    size += b.length;
    if (size > limit) return { chunks, rest: it };
  }
}

/**
 * Sends the chunks, then the rest, to out (the caller) and to stream
 * (idemsvc), at the pace of the slower: nothing is held but a chunk each.
 * It rejects when the payload breaks or the caller leaves.
 */
async function pump(chunks: Buffer[], rest: AsyncIterator<unknown>, out: PassThrough, stream: BodyStream | undefined): Promise<void> {
  const write = async (b: Buffer) => {
    const streamOk = stream === undefined || stream.write(b);
    if (!out.write(b)) await once(out, 'drain');
    if (!streamOk && stream!.full) await new Promise<void>((resolve) => (stream!.onFree = resolve));
  };
  for (const b of chunks) await write(b);
  chunks.length = 0;
  for (;;) {
    const next = await rest.next();
    if (next.done) break;
    await write(chunkOf(next.value));
  }
  out.end();
}

/**
 * Sends an answer of the plugin's own; the hook chain stops there. The body
 * goes as bytes, which Fastify sends as they are: given a string, it would
 * add a charset to a JSON content type.
 */
function send(reply: FastifyReply, answer: Answer): FastifyReply {
  if (answer.body instanceof Readable) {
    // A replay streamed from idemsvc: written here, the reply hijacked, so
    // that the handler never runs, whatever becomes of the stream (Fastify
    // runs it after a hook whose reply is not ended yet, and a body that
    // fails its check never ends: it destroys the answer, cut off short of
    // its Content-Length).
    reply.hijack();
    reply.raw.writeHead(answer.status, answer.headers);
    pipeline(answer.body, reply.raw, () => undefined);
    return reply;
  }
  const body = typeof answer.body === 'string' ? Buffer.from(answer.body) : answer.body;
  return reply.code(answer.status).headers(answer.headers).send(body);
}
