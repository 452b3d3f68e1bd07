// SPDX-License-Identifier: Apache-2.0

/**
 * Express middleware that makes routes idempotent per the Idempotency-Key
 * header draft; see {@link idempotency}.
 *
 * @module
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { pipeline } from 'node:stream';
import type { IdemClient } from './client.js';
import {
  acquire,
  identify,
  keyProblem,
  MAX_HELD_BODY_BYTES,
  parseKey,
  problemAnswer,
  settingsOf,
  startBodyStream,
  storeAnswer,
  tooLargeAnswer,
  type Answer,
  type BodyStream,
  type IdempotencyOptions,
  type Settings,
} from './middleware.js';

export { REPLAYED_HEADER, type IdempotencyContext, type IdempotencyOptions } from './middleware.js';
export { BODY_OMITTED_HEADER } from './do.js';

/** The request as the middleware reads it: Express's, or any node:http request. */
export type IdempotentRequest = IncomingMessage & {
  originalUrl?: string;
  /** The raw body, when a body parser before the middleware kept it (see {@link keepRawBody}). */
  rawBody?: Buffer | string;
};

type Response = ServerResponse & { locals?: Record<string, unknown> };
type Next = (err?: unknown) => void;

/**
 * A body parser's `verify` option that keeps the raw body for the
 * middleware, when the parser runs first:
 *
 * @example
 * app.use(express.json({ verify: keepRawBody }));
 * app.use(idempotency(client));
 */
export function keepRawBody(req: IncomingMessage, _res: unknown, body: Buffer): void {
  (req as IdempotentRequest).rawBody = body;
}

/**
 * Makes the routes after it idempotent, per the Idempotency-Key header draft
 * (draft-ietf-httpapi-idempotency-key-header), as the Go SDK's middleware
 * does. A request of a configured method (POST, PATCH) with the key header
 * runs the handler at most once per key: a duplicate gets the stored answer
 * byte for byte, with `Idempotent-Replayed: true`. The key is a Structured
 * Field String (`"abc"`), or for compatibility a bare `abc`; an empty,
 * malformed or over-long key gets 400. The fingerprint is a SHA-256 of the
 * method, path, query and body (a JSON body in its RFC 8785 canonical form,
 * so member order and whitespace do not matter), so reusing a key for
 * another request gets 422; a duplicate of a request still running gets
 * 409 with Retry-After.
 * A 5xx, 408 or 429 and a thrown error fail the attempt retryably, so a
 * retry runs the handler again; an error after part of the answer was
 * written cuts the connection, as without the middleware (see below). When
 * the caller leaves before the handler answers, the key stays held while
 * the handler may still run: its answer, if it comes within a lease, is
 * stored for the retry; otherwise the attempt fails retryably then. An
 * answer too large to store is stored without its body and replayed with
 * `Idempotent-Body-Omitted: true`, unless `maxStreamedBodyBytes` streams it
 * to idemsvc as it is written (its replays then stream it back, checked
 * against its SHA-256). Without idemsvc it fails closed with 503.
 *
 * The handler's answer is held until it is stored, then sent; once the
 * handler has begun it, `res.headersSent` is true and setting a header
 * throws, as for an answer whose head is out. Mount the
 * middleware before body parsers (it reads the body and puts it back for
 * them), or after one whose `verify` is {@link keepRawBody}. The handler
 * finds `res.locals.idempotency` ({@link IdempotencyContext}).
 *
 * Keys are scoped to the end user: by `scope` (mount the middleware after
 * the authentication it reads), part of the stored key; without one, by a
 * keyed digest of the caller's credentials (the Authorization header and
 * `credentialCookies`) in the fingerprint. Either way another user's
 * request with the same key never gets this user's answer. `unscoped`
 * turns both off.
 *
 * @example
 * import express from 'express';
 * import { IdemClient } from '@idemsvc/client';
 * import { idempotency } from '@idemsvc/client/express';
 *
 * const app = express();
 * app.use(authenticate); // sets req.user
 * app.use(idempotency(new IdemClient({ baseUrl: 'http://idemsvc:8080', apiKey }), { scope: (req) => req.user?.id }));
 * app.post('/charges', express.json(), (req, res) => { res.status(201).json(charge(req.body)); });
 */
export function idempotency<Req extends IdempotentRequest = IdempotentRequest>(
  client: IdemClient,
  options?: IdempotencyOptions<Req>,
): (req: Req, res: Response, next: Next) => void {
  const settings = settingsOf(client, options);
  return function idempotencyMiddleware(req, res, next) {
    if (!settings.methods.has(req.method ?? '')) return next(); // not made idempotent: runs every time
    const header = req.headers[settings.keyHeaderLower];
    if (header === undefined) {
      if (settings.optional) return next();
      return send(res, keyProblem(settings, true));
    }
    const key = parseKey(header);
    if (key === undefined) return send(res, keyProblem(settings, false));
    handle(client, settings, key, req, res, next).catch(next);
  };
}

async function handle(client: IdemClient, settings: Settings, key: string, req: IdempotentRequest, res: Response, next: Next): Promise<void> {
  const body = await requestBody(req, settings.maxBodyBytes);
  if (body === 'too-large') return send(res, tooLargeAnswer());
  if (body === 'consumed') {
    return send(
      res,
      problemAnswer('internal', 'the request body was read before the idempotency middleware: mount it before body parsers, or give them verify: keepRawBody'),
    );
  }
  const scope = settings.scope as ((req: IdempotentRequest) => string | undefined | null) | undefined;
  const id = identify(settings, key, req.method!, req.originalUrl ?? req.url ?? '/', req.headers, body, () => scope?.(req));
  if (!('fingerprint' in id)) return send(res, id);
  const lease = await acquire(client, settings, id, req.headers['x-request-id'], res);
  if (!('lease_token' in lease)) return send(res, lease);

  const { answer, stored } = storeAnswer(client, settings, lease, res, (name) => res.getHeader(name), (context) => {
    if (res.locals) res.locals.idempotency = context;
  });
  const capture: Capture = new Capture(
    res,
    MAX_HELD_BODY_BYTES,
    (status) => answer.resolve({ status, body: capture.body(), streamed: capture.streamed }),
  );
  if (settings.maxStreamedBodyBytes > 0) {
    capture.open = (status) => startBodyStream(client, settings, lease, answer, status, (name) => res.getHeader(name));
  }
  // The handler ran: its caller gets its answer, whether or not storing it
  // worked; a duplicate then runs it again or gets 409.
  void stored.finally(() => capture.flush());
  next();
}

/**
 * The request body: the raw body a parser kept, or read from the stream
 * and put back for the parsers and handlers after the middleware.
 */
function requestBody(req: IdempotentRequest, limit: number): Promise<Buffer | 'too-large' | 'consumed'> {
  if (req.rawBody !== undefined) {
    const raw = typeof req.rawBody === 'string' ? Buffer.from(req.rawBody) : req.rawBody;
    return Promise.resolve(raw.length > limit ? 'too-large' : raw);
  }
  if (req.readableEnded || (req as { _body?: boolean })._body) return Promise.resolve('consumed');
  const declared = Number(req.headers['content-length']);
  if (declared > limit) return Promise.resolve('too-large');
  if (declared === 0 || (Number.isNaN(declared) && req.headers['transfer-encoding'] === undefined)) {
    return Promise.resolve(Buffer.alloc(0)); // no body: the stream is left alone
  }
  return readKeeping(req, limit);
}

/**
 * Reads the whole body of req and puts it back (unshift) before the stream
 * ends, so that whoever reads req next reads it all again. It reads in
 * paused mode, exactly what is buffered each time, which does not end the
 * stream; req.complete says the last byte has arrived.
 */
function readKeeping(req: IncomingMessage, limit: number): Promise<Buffer | 'too-large'> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const finish = (result: Buffer | 'too-large' | Error) => {
      req.off('readable', onReadable);
      req.off('error', finish);
      req.off('close', onClose);
      if (result instanceof Error) return reject(result);
      if (Buffer.isBuffer(result) && result.length > 0) req.unshift(result);
      resolve(result);
    };
    const onClose = () => finish(new Error('the request was cut short'));
    const onReadable = () => {
      for (let n = req.readableLength; n > 0; n = req.readableLength) {
        const chunk = req.read(n) as Buffer | null;
        if (chunk === null) break;
        chunks.push(chunk);
        size += chunk.length;
        if (size > limit) return finish('too-large');
      }
      if (req.complete) finish(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size));
    };
    req.on('readable', onReadable);
    req.on('error', finish);
    req.on('close', onClose);
  });
}

/**
 * Holds the handler's answer: writeHead, write and end are captured until
 * flush sends it. A body over the limit is not held: from the write that
 * crosses it, the answer goes to the caller as it is written (streamed).
 * `ended` is called with the status when the handler ends its answer.
 *
 * Once the handler has begun its answer (writeHead or a write), the held
 * response acts as one whose head is out, as it would without the
 * middleware: headersSent is true, a header change throws
 * ERR_HTTP_HEADERS_SENT, and a status set later is ignored. So an error
 * after part of the answer reaches Express's error handling as it would
 * without the middleware, which cuts the connection, instead of adding an
 * error page to the part held and storing both as the answer.
 */
class Capture {
  readonly chunks: Buffer[] = [];
  readonly callbacks: Array<() => void> = [];
  /** res's own methods that the capture replaces: those of the head, and write and end. */
  readonly originalHead: Partial<HeadMethods>;
  readonly original: Pick<ServerResponse, 'write' | 'end'>;
  private size = 0;
  ended = false;
  private flushed = false;
  /** The status the answer began with: set by the handler's writeHead or first write. */
  began: number | undefined;
  /** Whether the answer went to the caller as it was written, not held. */
  streamed = false;
  /** Starts storing the body as it is written, when it goes over the limit (maxStreamedBodyBytes). */
  open: ((status: number) => BodyStream | undefined) | undefined = undefined;
  /** Where the body goes beside the caller, once streamed and stored so. */
  private tee: BodyStream | undefined = undefined;
  /** res's own emit, while a drain is held back for the tee. */
  private originalEmit: ServerResponse['emit'] | undefined = undefined;

  constructor(
    private readonly res: Response,
    private readonly limit: number,
    /** Called with the status when the handler ends its answer. */
    readonly onEnd: (status: number) => void,
  ) {
    // The replacements are functions shared by every request, which find
    // their capture on res: no closures per request, and res keeps the same
    // hidden classes from one request to the next (V8), where functions
    // made per request gave it new ones.
    const head = res as unknown as HeadMethods;
    this.originalHead = {
      writeHead: head.writeHead,
      _implicitHeader: head._implicitHeader,
      setHeader: head.setHeader,
      removeHeader: head.removeHeader,
      appendHeader: head.appendHeader,
    };
    this.original = { write: res.write, end: res.end };
    const target = res as unknown as CapturedResponse;
    target[CAPTURE] = this;
    target.writeHead = capturedWriteHead as unknown as HeadMethods['writeHead'];
    if (typeof head._implicitHeader === 'function') target._implicitHeader = capturedImplicitHeader;
    if (typeof head.setHeader === 'function') target.setHeader = capturedSetHeader;
    if (typeof head.removeHeader === 'function') target.removeHeader = capturedRemoveHeader;
    if (typeof head.appendHeader === 'function') target.appendHeader = capturedAppendHeader;
    target.write = capturedWrite;
    target.end = capturedEnd as unknown as ServerResponse['end'];
    Object.defineProperty(res, 'headersSent', CAPTURED_HEADERS_SENT);
  }

  /** Gives res back its own head methods and headersSent, once Node's own say what is sent. */
  private restoreHead(): void {
    const head = this.res as unknown as HeadMethods;
    const original = this.originalHead;
    head.writeHead = original.writeHead!;
    if (original._implicitHeader) head._implicitHeader = original._implicitHeader;
    if (original.setHeader) head.setHeader = original.setHeader;
    if (original.removeHeader) head.removeHeader = original.removeHeader;
    if (original.appendHeader) head.appendHeader = original.appendHeader;
    // A delete measured cheaper than defining the prototype's accessor again.
    delete (this.res as { headersSent?: boolean }).headersSent;
  }

  /** Holds a chunk, or writes it when the answer is streamed; false asks the writer to wait for 'drain'. */
  append(chunk: unknown, encoding: unknown, cb: unknown): boolean {
    if (typeof encoding === 'function') [encoding, cb] = [undefined, encoding];
    let b: Buffer | undefined;
    if (chunk === undefined || chunk === null || this.ended) b = undefined;
    else if (typeof chunk === 'string') b = Buffer.from(chunk, (encoding as BufferEncoding | undefined) ?? 'utf8');
    else if (chunk instanceof Uint8Array) b = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    if (!this.streamed && b !== undefined && this.size + b.length > this.limit) this.stream();
    if (this.streamed) {
      return b === undefined
        ? (typeof cb === 'function' && process.nextTick(cb as () => void), true)
        : this.writeThrough(b, cb as ((err?: Error | null) => void) | undefined);
    }
    if (typeof cb === 'function') this.callbacks.push(cb as () => void);
    if (b !== undefined) {
      this.chunks.push(b);
      this.size += b.length;
    }
    return true;
  }

  /** Sends the head and the body held so far, and lets what follows through. */
  stream(): void {
    this.streamed = true;
    const tee = this.open?.(this.began ?? this.res.statusCode);
    if (tee !== undefined) this.startTee(tee);
    // The head goes out with the first write, through res's own writeHead
    // (and the hooks of middleware before this one).
    this.restoreHead();
    for (const chunk of this.chunks) this.writeThrough(chunk);
    this.chunks.length = 0;
    for (const cb of this.callbacks.splice(0)) process.nextTick(cb);
  }

  /** Writes to the caller's connection, past the capture, and to the tee; false asks the writer to wait for both. */
  private writeThrough(chunk: Buffer, cb?: (err?: Error | null) => void): boolean {
    const write = this.original.write as (this: ServerResponse, chunk: Buffer, cb?: (err?: Error | null) => void) => boolean;
    const ok = write.call(this.res, chunk, cb);
    return this.tee === undefined ? ok : this.tee.write(chunk) && ok;
  }

  /**
   * Sends the body to tee too. A writer that waits for 'drain' then waits
   * for both: res's own drain is held back while the tee is full, and
   * given when the tee drains and res needs none.
   */
  private startTee(tee: BodyStream): void {
    this.tee = tee;
    const res = this.res;
    const emit = (this.originalEmit = res.emit);
    let held = false;
    res.emit = function (this: ServerResponse, event: string | symbol, ...args: unknown[]) {
      if (event === 'drain' && tee.full) {
        held = true;
        return false;
      }
      return emit.call(this, event, ...args);
    } as ServerResponse['emit'];
    tee.onFree = () => {
      if (held || !res.writableNeedDrain) {
        held = false;
        emit.call(res, 'drain');
      }
    };
  }

  /** Ends the tee's part: res emits as it did. */
  endTee(): void {
    if (this.originalEmit !== undefined) {
      this.res.emit = this.originalEmit;
      this.originalEmit = undefined;
    }
    if (this.tee !== undefined) this.tee.onFree = undefined;
  }

  /** The body the handler wrote, as held (empty when streamed). */
  body(): Buffer {
    return this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks);
  }

  /** Sends the held answer, once the handler has ended it. */
  flush(): void {
    if (this.flushed || !this.ended) return;
    this.flushed = true;
    this.restoreHead();
    this.res.write = this.original.write;
    this.res.end = this.original.end;
    if (this.streamed) return; // sent as it was written
    const callbacks = this.callbacks;
    this.res.end(this.body(), () => callbacks.forEach((cb) => cb()));
  }
}

/** Sets the headers of a writeHead call: an object, or a flat or paired array. */
function setHeaders(res: ServerResponse, headers: unknown): void {
  if (Array.isArray(headers)) {
    const pairs = Array.isArray(headers[0]) ? (headers as [string, string][]) : [];
    if (pairs.length === 0) for (let i = 0; i + 1 < headers.length; i += 2) pairs.push([headers[i], headers[i + 1]]);
    for (const [name, value] of pairs) res.setHeader(name, value);
  } else if (headers && typeof headers === 'object') {
    for (const [name, value] of Object.entries(headers)) {
      if (value !== undefined) res.setHeader(name, value as string | string[] | number);
    }
  }
}

/** The methods of a response's head that the capture replaces while it holds the answer. */
type HeadMethods = Pick<ServerResponse, 'writeHead' | 'setHeader' | 'removeHeader' | 'appendHeader'> & { _implicitHeader(): void };

/** Where a held response's capture is. */
const CAPTURE = Symbol('idemsvc capture');
type CapturedResponse = HeadMethods & Pick<ServerResponse, 'write' | 'end' | 'statusCode' | 'statusMessage'> & { [CAPTURE]: Capture };

function captureOf(res: unknown): Capture {
  return (res as CapturedResponse)[CAPTURE];
}

// writeHead(status[, statusMessage][, headers]): the headers join the others.
function capturedWriteHead(this: CapturedResponse, status: number, ...rest: unknown[]) {
  const capture = captureOf(this);
  if (capture.began !== undefined) throw headersSentError('write');
  this.statusCode = status;
  if (typeof rest[0] === 'string') this.statusMessage = rest.shift() as string;
  setHeaders(this as unknown as ServerResponse, rest[0]);
  capture.began = status;
  return this;
}

// What Node calls when a head is due and none was written; some middleware
// call it on every write while the head is not out.
function capturedImplicitHeader(this: CapturedResponse) {
  if (captureOf(this).began === undefined) this.writeHead(this.statusCode);
}

function capturedSetHeader(this: CapturedResponse, ...args: Parameters<ServerResponse['setHeader']>) {
  const capture = captureOf(this);
  if (capture.began !== undefined) throw headersSentError('set');
  return capture.originalHead.setHeader!.apply(this as unknown as ServerResponse, args);
}

function capturedRemoveHeader(this: CapturedResponse, ...args: Parameters<ServerResponse['removeHeader']>) {
  const capture = captureOf(this);
  if (capture.began !== undefined) throw headersSentError('remove');
  return capture.originalHead.removeHeader!.apply(this as unknown as ServerResponse, args);
}

function capturedAppendHeader(this: CapturedResponse, ...args: Parameters<ServerResponse['appendHeader']>) {
  const capture = captureOf(this);
  if (capture.began !== undefined) throw headersSentError('append');
  return capture.originalHead.appendHeader!.apply(this as unknown as ServerResponse, args);
}

function capturedWrite(this: CapturedResponse, chunk: unknown, encoding?: unknown, cb?: unknown) {
  const capture = captureOf(this);
  capture.began ??= this.statusCode;
  return capture.append(chunk, encoding, cb);
}

function capturedEnd(this: CapturedResponse, chunk?: unknown, encoding?: unknown, cb?: unknown) {
  const capture = captureOf(this);
  if (capture.ended) return this;
  if (typeof chunk === 'function') [chunk, cb] = [undefined, chunk];
  capture.append(chunk, encoding, cb);
  capture.ended = true;
  // A status set after the answer began does not reach the caller.
  if (capture.began !== undefined) this.statusCode = capture.began;
  if (capture.streamed) {
    capture.endTee();
    (capture.original.end as () => ServerResponse).call(this as unknown as ServerResponse);
  }
  capture.onEnd(this.statusCode);
  return this;
}

const CAPTURED_HEADERS_SENT: PropertyDescriptor = {
  configurable: true,
  get(this: unknown) {
    return captureOf(this).began !== undefined;
  },
};

/** The error Node throws for a change to a response whose head is out. */
function headersSentError(action: string): Error {
  return Object.assign(new Error(`Cannot ${action} headers after they are sent to the client`), { code: 'ERR_HTTP_HEADERS_SENT' });
}

/** Writes an answer of the middleware's own. */
function send(res: ServerResponse, answer: Answer): void {
  res.statusCode = answer.status;
  for (const [name, value] of Object.entries(answer.headers)) res.setHeader(name, value);
  if (typeof answer.body === 'string' || Buffer.isBuffer(answer.body)) {
    res.end(answer.body);
    return;
  }
  // A body streamed from idemsvc: one that fails its check destroys res,
  // cutting the answer off short of its Content-Length.
  pipeline(answer.body, res, () => undefined);
}
