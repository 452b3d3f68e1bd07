// SPDX-License-Identifier: Apache-2.0

import { createHash } from 'node:crypto';
import * as http from 'node:http';
import * as https from 'node:https';
import { pipeline, Readable, Transform, type TransformCallback } from 'node:stream';
import { Batcher, MAX_ITEM_CHARS, type BatchReply } from './batch.js';
import { doOnce, type DoOptions, type DoResult, type Operation } from './do.js';
import { BodyMismatchError, IdemError, problemOf, type Problem } from './errors.js';
import { backoff, newOwner, sleep } from './retry.js';
import { CALL_DEADLINE } from './types.js';
import type { components } from './schema.js';
import type {
  BeginParams,
  BeginResult,
  CallOptions,
  CompleteParams,
  CompleteStreamParams,
  ExtendParams,
  FailParams,
  FinishResult,
  Health,
  KeyList,
  Lease,
  LeaseCalls,
  ListParams,
  Readiness,
  StatusRecord,
  TenantUsage,
} from './types.js';

// The API's types live in types.ts, which do.ts shares without importing
// this module; they are exported from here too, as they always were.
export type {
  BeginParams,
  CompleteParams,
  CompleteStreamParams,
  FailParams,
  ExtendParams,
  BeginAcquired,
  BeginReplay,
  BeginResult,
  FinishResult,
  Lease,
  StatusRecord,
  KeyList,
  State,
  Health,
  Readiness,
  TenantUsage,
  ListParams,
  CallOptions,
} from './types.js';

export interface IdemClientOptions {
  /** Where idemsvc serves, e.g. `http://idemsvc:8080`. */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** The tenant to act for; only an admin key may name another tenant than its own. */
  tenant?: string;
  /** Bounds each HTTP request, plus a begin's `wait_ms` (default 10 s). */
  callTimeoutMs?: number;
  /** Bounds the time spent retrying one call (default 15 s); 0 turns retries off. */
  retryBudgetMs?: number;
  /**
   * The fetch to call with. By default calls go through node:http on
   * keep-alive connections of the client's own, which costs the caller a
   * tenth of the CPU of a fetch per call.
   */
  fetch?: typeof globalThis.fetch;
  /**
   * Sends the begins, and the completes, asked for in one turn of the event
   * loop together, as one batch call (`POST /v1/begin/batch`, `POST
   * /v1/finish/batch`), when there are several (default false). A busy
   * service, such as one behind the Express middleware under load, then
   * makes one HTTP exchange, and idemsvc serves one request, for many calls;
   * a lone call goes alone, as without it. Only begins without `wait_ms`
   * (a batch does not wait) and completes, each without a signal or a
   * request id, and with a body under 16 KiB, are coalesced; an item the
   * batch does not answer with a success, and every item of a batch that
   * fails, is sent again as its own call, so answers, errors and retries are
   * those of the single calls. idemsvc then logs one line per batch, not
   * per call, and its tenant limits count each item.
   */
  coalesce?: boolean;
}

/** Defaults of IdemClientOptions. */
export const DEFAULT_CALL_TIMEOUT_MS = 10_000;
export const DEFAULT_RETRY_BUDGET_MS = 15_000;

/** This SDK's version, sent in the User-Agent of every call. */
export const VERSION = '0.1.0';

/**
 * The client's connections: kept alive, and an idle one closed after 4 s
 * (fetch's default), well before a server's idle timeout closes it under a
 * call being sent (a call cut so is retried all the same).
 */
const AGENT_OPTIONS: http.AgentOptions = { keepAlive: true, timeout: 4_000 };

const MAX_ERROR_BYTES = 1024;

/**
 * The client of idemsvc. Every call of the API is a method; each is retried
 * on network errors, 503 and 429 answers, with exponential backoff and
 * jitter, honouring Retry-After, within the retry budget. Retrying is safe:
 * a begin carries an owner (made up per call and kept across its retries),
 * complete and fail carry the lease token, and the others only read or
 * forget. A Retry-After beyond the budget is not waited for.
 *
 * Calls go through node:http (node:https) on keep-alive connections of
 * the client's own: a plain JSON API needs no more, the SDK then depends on
 * nothing, and a call costs a tenth of the CPU of a `fetch` (whose Request,
 * web streams and AbortSignal cost about 1 ms of CPU per call under load),
 * as make load-sdk measures.
 *
 * @example
 * const idem = new IdemClient({ baseUrl: 'http://idemsvc:8080', apiKey: process.env.IDEMSVC_API_KEY });
 * const res = await idem.begin({ key: 'order-7f3a/charge' });
 * if (res.status === 'acquired') {
 *   await idem.complete({ key: res.key, lease_token: res.lease_token, response: { status_code: 201 } });
 * }
 */
/** The API key of each client: the default secret of the middleware's digest of its callers' credentials. */
const apiKeys = new WeakMap<IdemClient, string>();

/** The API key client was made with ('' for none). */
export function apiKeyOf(client: IdemClient): string {
  return apiKeys.get(client) ?? '';
}

export class IdemClient implements LeaseCalls {
  readonly baseUrl: string;
  readonly callTimeoutMs: number;
  readonly retryBudgetMs: number;
  private readonly tenant: string | undefined;
  private readonly headers: Record<string, string>;
  private readonly fetch: typeof globalThis.fetch | undefined;
  /** Where node:http sends calls, when there is no fetch. */
  private readonly target: Target;
  /** The begins and the completes waiting to go together, with coalesce. */
  private readonly begins: Batcher<BeginResult> | undefined;
  private readonly completes: Batcher<FinishResult> | undefined;

  constructor(options: IdemClientOptions) {
    const url = new URL(options.baseUrl);
    if (url.protocol !== 'http:' && url.protocol !== 'https:') {
      throw new TypeError('idem: baseUrl is not an http:// or https:// URL');
    }
    if (url.username || url.password) {
      // fetch refuses such a URL, and its error would carry the credentials.
      throw new TypeError('idem: baseUrl carries credentials; give the API key as apiKey');
    }
    this.baseUrl = url.href.replace(/\/+$/, '');
    this.callTimeoutMs = options.callTimeoutMs && options.callTimeoutMs > 0 ? options.callTimeoutMs : DEFAULT_CALL_TIMEOUT_MS;
    this.retryBudgetMs = options.retryBudgetMs ?? DEFAULT_RETRY_BUDGET_MS;
    this.tenant = options.tenant || undefined;
    this.fetch = options.fetch;
    const secure = url.protocol === 'https:';
    this.target = {
      request: secure ? https.request : http.request,
      options: {
        protocol: url.protocol,
        hostname: url.hostname.replace(/^\[(.*)\]$/, '$1'),
        port: url.port || (secure ? 443 : 80),
        agent: new (secure ? https.Agent : http.Agent)(AGENT_OPTIONS),
      },
      basePath: url.pathname.replace(/\/+$/, ''),
    };
    this.headers = { 'content-type': 'application/json', 'user-agent': `idemsvc-ts/${VERSION}` };
    if (options.apiKey) {
      if (/[\0-\x1f\x7f]/.test(options.apiKey)) {
        throw new TypeError('idem: the API key has a control character (a line end read from a file, say), which no HTTP header can carry');
      }
      if (/[^\x20-\x7e]/.test(options.apiKey)) {
        throw new TypeError('idem: the API key has a character outside printable ASCII, which idemsvc never issues');
      }
      this.headers.authorization = `Bearer ${options.apiKey}`;
      apiKeys.set(this, options.apiKey);
    }
    if (options.coalesce) {
      const sendBatch = (path: string, body: string, ms: number) => this.sendBatch(path, body, ms);
      this.begins = new Batcher<BeginResult>('/v1/begin/batch', sendBatch);
      this.completes = new Batcher<FinishResult>('/v1/finish/batch', sendBatch);
    }
  }

  /**
   * Begins an attempt for `params.key`: an acquired lease (`status:
   * "acquired"`), or the stored outcome of a finished attempt. A key in
   * progress elsewhere throws an IdemError of kind `in-progress`, with
   * `retryAfterMs` and the holder's `problem.lease_expires_at`.
   */
  begin(params: BeginParams, options?: CallOptions): Promise<BeginResult> {
    const body = this.body({ ...params, owner: params.owner || newOwner() });
    const timeout = this.callTimeoutMs + (params.wait_ms ?? 0);
    const alone = () => this.call('begin', 'POST', '/v1/begin', body, options, timeout, json<BeginResult>);
    if (this.begins?.on && !params.wait_ms && coalescible(body, options)) {
      return this.begins.add(body, itemDeadline(timeout, options), alone);
    }
    return alone();
  }

  /** Stores `params.response` as the outcome of the attempt holding `params.lease_token`. */
  complete(params: CompleteParams, options?: CallOptions): Promise<FinishResult> {
    const body = this.body(params);
    const alone = () => this.call('complete', 'POST', '/v1/complete', body, options, this.callTimeoutMs, json<FinishResult>);
    if (this.completes?.on && coalescible(body, options)) {
      // A finish batch's item is the complete's body with its kind.
      return this.completes.add('{"kind":"complete",' + body.slice(1), itemDeadline(this.callTimeoutMs, options), alone);
    }
    return alone();
  }

  /** One batch call, not retried: its items are sent again alone when it fails. */
  private async sendBatch(path: string, body: string, ms: number): Promise<BatchReply> {
    if (this.fetch) return fetchReply(this.fetch, this.baseUrl + path, 'POST', this.headers, body, ms, undefined);
    const headers = { ...this.headers, 'content-length': String(Buffer.byteLength(body)) };
    return send(this.target, 'POST', path, headers, body, ms, undefined);
  }

  /**
   * Stores a response whose body is streamed (`POST /v1/complete/stream`):
   * up to idemsvc's `IDEMSVC_MAX_STORED_BYTES` (64 MiB by default) with a
   * blob store, never held whole. The body is bytes, a Node `Readable`, a
   * web `ReadableStream` or any async iterable of bytes, sent as the
   * request's own body as it is read (chunked, unless `params.size` gives
   * its length). Bytes are sent again when a try gets 503 (the blob store
   * down, say) or no answer, within the retry budget; a stream is sent once,
   * and a stream that errors aborts the call (nothing is stored).
   */
  async completeStream(params: CompleteStreamParams, body: StreamBody, options?: CallOptions): Promise<FinishResult> {
    const headers: Record<string, string> = {
      ...this.headers,
      'content-type': 'application/octet-stream',
      'idem-key': params.key,
      'idem-lease-token': params.lease_token,
    };
    if (params.status_code !== undefined) headers['idem-response-status'] = String(params.status_code);
    if (params.headers && Object.keys(params.headers).length > 0) {
      // JSON with every non-ASCII character escaped: a header carries ASCII.
      headers['idem-response-headers'] = JSON.stringify(params.headers).replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
    }
    if (params.retention_s !== undefined) headers['idem-retention-s'] = String(params.retention_s);
    if (this.tenant !== undefined) headers['idem-tenant'] = this.tenant;
    const bytes = body instanceof Uint8Array;
    if (bytes) headers['content-length'] = String(body.byteLength);
    else if (params.size !== undefined && params.size >= 0) headers['content-length'] = String(params.size);
    const res = await this.stream('complete', 'POST', '/v1/complete/stream', headers, body, bytes, options);
    return JSON.parse((await readAll(res.body)).toString()) as FinishResult;
  }

  /**
   * Streams the stored body of a finished key (`GET /v1/keys/body`): a
   * replay whose `response.body_ref` names it. `body` is a Node `Readable`
   * (an async iterable; `Readable.toWeb` makes it a web stream) checked as
   * it goes against its `Content-Length` and its SHA-256 (`Repr-Digest`):
   * its last chunk is held back until every byte matched, so a body that
   * is not the stored one errors with `BodyMismatchError` before its end,
   * and a whole wrong body is never delivered. `size` is its length.
   */
  async openBody(key: string, options?: CallOptions): Promise<{ body: Readable; size: number }> {
    const res = await this.stream('body', 'GET', `/v1/keys/body?${this.query({ key })}`, this.headers, undefined, true, options);
    const size = Number(res.headers['content-length'] ?? '-1');
    const digest = /^sha-256=:(.*):$/.exec(String(res.headers['repr-digest'] ?? ''))?.[1];
    const checked = new CheckedBody(size, digest);
    const source = res.body;
    // A source that ends early or breaks is no whole body either; a reader
    // that leaves ends the source.
    const cut = (err?: Error) => {
      if (!checked.destroyed) checked.destroy(new BodyMismatchError({ cause: err }));
    };
    source.on('error', cut);
    source.on('close', () => source.readableEnded || cut());
    checked.on('close', () => source.destroy());
    source.pipe(checked);
    return { body: checked, size };
  }

  /**
   * One call whose body or answer is a stream: retried as call does while
   * retry allows; a success's answer is left unread (its status, headers
   * and body stream).
   */
  private async stream(
    op: string,
    method: string,
    path: string,
    headers: Record<string, string>,
    body: StreamBody | undefined,
    retry: boolean,
    options: CallOptions | undefined,
  ): Promise<StreamReply> {
    const signal = options?.signal;
    const deadline = Date.now() + this.retryBudgetMs;
    // The body's own time comes on top of a call's: up to 10 minutes.
    const ms = this.callTimeoutMs + (body === undefined ? 0 : STREAM_BODY_MS);
    for (let attempt = 0; ; attempt++) {
      signal?.throwIfAborted();
      let err: IdemError;
      try {
        const reply = this.fetch
          ? await fetchStream(this.fetch, this.baseUrl + path, method, headers, body, ms, signal)
          : await sendStream(this.target, method, path, headers, body, ms, signal);
        if (reply.status < 300) return reply;
        err = errorOf(op, {
          status: reply.status,
          statusText: reply.statusText,
          contentType: String(reply.headers['content-type'] ?? ''),
          retryAfter: reply.headers['retry-after'] as string | undefined,
          body: await readAll(reply.body),
        });
      } catch (cause) {
        if (signal?.aborted) throw signal.reason;
        if (cause instanceof IdemError) throw cause;
        const detail = `idemsvc could not be reached: ${cause instanceof Error ? cause.message : String(cause)}`;
        err = new IdemError(op, 0, problemOf('store-unavailable', detail), undefined, { cause });
      }
      if (!retry || (err.status !== 0 && err.status !== 503 && err.status !== 429)) throw err;
      const wait = err.retryAfterMs ?? backoff(attempt);
      if (Date.now() + wait > deadline) throw err;
      await sleep(wait, signal);
    }
  }

  /**
   * Ends the attempt holding `params.lease_token` with a failure: retryable
   * (the default) releases the key, `retryable: false` stores a terminal
   * failure that begin replays.
   */
  fail(params: FailParams, options?: CallOptions): Promise<FinishResult> {
    const body = params.error === undefined ? params : { ...params, error: shortMessage(params.error) };
    return this.call('fail', 'POST', '/v1/fail', this.body(body), options, this.callTimeoutMs, json<FinishResult>);
  }

  /** Pushes the lease of the attempt holding `params.lease_token` to now + `lease_ms`. */
  extend(params: ExtendParams, options?: CallOptions): Promise<Lease> {
    return this.call('extend', 'POST', '/v1/extend', this.body(params), options, this.callTimeoutMs, json<Lease>);
  }

  /** Reads key's record; an IdemError of kind `not-found` when there is none. */
  status(key: string, options?: CallOptions & { includeResponse?: boolean }): Promise<StatusRecord> {
    const query = this.query({ key, include_response: options?.includeResponse ? 'true' : undefined });
    return this.call('status', 'GET', `/v1/status?${query}`, undefined, options, this.callTimeoutMs, json<StatusRecord>);
  }

  /** Forgets key's record; deleting an absent record is no error. */
  async delete(key: string, options?: CallOptions): Promise<void> {
    await this.call('delete', 'DELETE', `/v1/keys?${this.query({ key })}`, undefined, options, this.callTimeoutMs, drain);
  }

  /** One page of the tenant's records in `params.state`, without their responses. */
  listKeys(params: ListParams, options?: CallOptions): Promise<KeyList> {
    const query = this.query({
      state: params.state,
      older_than_s: params.older_than_s?.toString(),
      limit: params.limit?.toString(),
      cursor: params.cursor,
    });
    return this.call('list', 'GET', `/v1/keys?${query}`, undefined, options, this.callTimeoutMs, json<KeyList>);
  }

  /**
   * Every record of the tenant in `params.state`, a page per call as the
   * loop goes on. A record that exists for the whole listing comes at least
   * once. A cursor that can no longer be followed (a Redis node failed over)
   * throws kind `invalid-request`: start the listing again.
   */
  async *keys(params: Omit<ListParams, 'cursor'>, options?: CallOptions): AsyncGenerator<StatusRecord, void, undefined> {
    let cursor: string | undefined;
    do {
      const page = await this.listKeys({ ...params, cursor }, options);
      yield* page.items;
      cursor = page.next_cursor || undefined;
    } while (cursor !== undefined);
  }

  /** Liveness: resolves while idemsvc's process is alive. Not retried. */
  healthz(options?: CallOptions): Promise<Health> {
    return this.call('healthz', 'GET', '/healthz', undefined, options, this.callTimeoutMs, json<Health>, false);
  }

  /**
   * Readiness: `status: "ok"`, or `status: "unavailable"` with each failed
   * check of each Redis node (idemsvc's 503). Not retried.
   */
  async readyz(options?: CallOptions): Promise<Health | Readiness> {
    try {
      return await this.call('readyz', 'GET', '/readyz', undefined, options, this.callTimeoutMs, json<Health>, false);
    } catch (err) {
      const failures = err instanceof IdemError && err.status === 503 ? (err.cause as Readiness | undefined) : undefined;
      if (failures?.status === 'unavailable') return failures;
      throw err;
    }
  }

  /**
   * The usage of the client's tenant against its limits, or, for an admin
   * key without a tenant, of every tenant. Begins per second and rejections
   * are those of the idemsvc instance that answered; stored bytes, waiters
   * and attempts in progress are shared by every instance.
   */
  async usage(options?: CallOptions): Promise<TenantUsage[]> {
    const q = this.query({});
    const list = await this.call('usage', 'GET', q ? `/v1/usage?${q}` : '/v1/usage', undefined, options, this.callTimeoutMs, json<components['schemas']['UsageList']>);
    return list.tenants;
  }

  /** The Prometheus metrics, as text. Not retried. */
  metrics(options?: CallOptions): Promise<string> {
    return this.call('metrics', 'GET', '/metrics', undefined, options, this.callTimeoutMs, text, false);
  }

  /**
   * Runs `fn` at most once for `key`, across every caller of idemsvc, and
   * gives every caller its outcome; see {@link doOnce}.
   */
  doOnce(key: string, fn: Operation, options?: DoOptions): Promise<DoResult> {
    return doOnce(this, key, fn, options);
  }

  /** The JSON body of a POST, with the client's tenant. */
  private body(params: object): string {
    return JSON.stringify(this.tenant === undefined ? params : { ...params, tenant: this.tenant });
  }

  /** The query string of a GET or DELETE, with the client's tenant. */
  private query(params: Record<string, string | undefined>): string {
    const q = new URLSearchParams();
    for (const [name, value] of Object.entries(params)) {
      if (value !== undefined) q.set(name, value);
    }
    if (this.tenant !== undefined) q.set('tenant', this.tenant);
    return q.toString();
  }

  /**
   * Makes one API call until it succeeds, fails for good, or the retry
   * budget or the caller's signal ends; `read` decodes a 2xx answer.
   */
  private async call<T>(
    op: string,
    method: string,
    path: string,
    body: string | undefined,
    options: CallOptions | undefined,
    timeoutMs: number,
    read: (reply: Reply) => T,
    retry = true,
  ): Promise<T> {
    const signal = options?.signal;
    // A request id that no header can carry (a control character, or one
    // past Latin-1, which node:http and fetch refuse) is not sent.
    let headers = options?.requestId && /^[\x20-\x7e\x80-\xff]*$/.test(options.requestId)
      ? { ...this.headers, 'x-request-id': options.requestId }
      : this.headers;
    if (body !== undefined && this.fetch === undefined) {
      // A length, so that node:http does not send the body chunked.
      headers = { ...headers, 'content-length': String(Buffer.byteLength(body)) };
    }
    const end = options?.[CALL_DEADLINE];
    let deadline = Date.now() + this.retryBudgetMs;
    if (end !== undefined && end < deadline) deadline = end;
    for (let attempt = 0; ; attempt++) {
      signal?.throwIfAborted();
      let ms = timeoutMs;
      if (end !== undefined) ms = Math.max(0, Math.min(ms, end - Date.now()));
      let err: IdemError;
      try {
        if (ms === 0) throw new Error('no time left within the deadline');
        const reply = this.fetch
          ? await fetchReply(this.fetch, this.baseUrl + path, method, headers, body, ms, signal)
          : await send(this.target, method, path, headers, body, ms, signal);
        if (reply.status < 300) return read(reply);
        err = errorOf(op, reply);
      } catch (cause) {
        if (signal?.aborted) throw signal.reason;
        if (cause instanceof IdemError) throw cause;
        const detail = `idemsvc could not be reached: ${cause instanceof Error ? cause.message : String(cause)}`;
        err = new IdemError(op, 0, problemOf('store-unavailable', detail), undefined, { cause });
      }
      if (!retry || (err.status !== 0 && err.status !== 503 && err.status !== 429)) throw err;
      const wait = err.retryAfterMs ?? backoff(attempt);
      if (Date.now() + wait > deadline) throw err;
      await sleep(wait, signal);
    }
  }
}

/**
 * Whether a call may join a batch: its body small and the JSON of an
 * object, and no signal or request id, which a batch's items cannot carry
 * each.
 */
function coalescible(body: string, options: CallOptions | undefined): boolean {
  return body.length <= MAX_ITEM_CHARS && body.length > 2 && options?.signal === undefined && !options?.requestId;
}

/** When a call joining a batch is due to end: its deadline, or its timeout from now. */
function itemDeadline(timeoutMs: number, options: CallOptions | undefined): number {
  const now = Date.now() + timeoutMs;
  const end = options?.[CALL_DEADLINE];
  return end !== undefined && end < now ? end : now;
}

/** An answer, read whole: the status, the headers the client reads, the body. */
interface Reply {
  status: number;
  statusText: string;
  contentType: string;
  retryAfter: string | undefined;
  body: Buffer;
}

/** Where node:http sends a client's calls: its request function, host, port, agent and the base URL's path. */
interface Target {
  request: typeof http.request;
  options: http.RequestOptions;
  basePath: string;
}

/** Ends an exchange once: with its reply, or with err when there is none. */
type Settle<T> = (err: unknown, reply?: T) => void;

/**
 * One exchange through node:http on the target's keep-alive agent: answer
 * makes the reply of the response, write sends the request's body, and both
 * end the exchange through settle. It rejects when the exchange fails, no
 * reply comes within ms, or signal fires (with its reason).
 */
function exchange<T>(
  target: Target,
  method: string,
  path: string,
  headers: Record<string, string>,
  ms: number,
  signal: AbortSignal | undefined,
  answer: (res: http.IncomingMessage, settle: Settle<T>) => void,
  write: (req: http.ClientRequest, settle: Settle<T>) => void,
): Promise<T> {
  return new Promise((resolve, reject) => {
    let settled = false;
    const settle: Settle<T> = (err, reply) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      if (reply) resolve(reply);
      else reject(err);
    };
    const req = target.request({ ...target.options, method, path: target.basePath + path, headers }, (res) => answer(res, settle));
    const onAbort = () => req.destroy(signal?.reason);
    const timer = setTimeout(() => req.destroy(new Error(`no answer within ${ms} ms`)), ms);
    signal?.addEventListener('abort', onAbort, { once: true });
    req.on('error', settle);
    write(req, settle);
  });
}

/** The answer read whole. */
function readWhole(res: http.IncomingMessage, settle: Settle<Reply>): void {
  const chunks: Buffer[] = [];
  res.on('data', (chunk: Buffer) => chunks.push(chunk));
  res.on('error', settle);
  res.on('close', () => settle(new Error('the answer was cut short')));
  res.on('end', () =>
    settle(undefined, {
      status: res.statusCode ?? 0,
      statusText: res.statusMessage ?? '',
      contentType: res.headers['content-type'] ?? '',
      retryAfter: res.headers['retry-after'],
      body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks),
    }),
  );
}

/** One exchange whose answer is read whole (see exchange). */
function send(
  target: Target,
  method: string,
  path: string,
  headers: Record<string, string>,
  body: string | undefined,
  ms: number,
  signal: AbortSignal | undefined,
): Promise<Reply> {
  return exchange(target, method, path, headers, ms, signal, readWhole, (req) => req.end(body));
}

/** One exchange through a fetch given in the options, read whole. */
async function fetchReply(
  fetch: typeof globalThis.fetch,
  url: string,
  method: string,
  headers: Record<string, string>,
  body: string | undefined,
  ms: number,
  signal: AbortSignal | undefined,
): Promise<Reply> {
  const timeout = timeoutSignal(ms, signal);
  try {
    const res = await fetch(url, { method, headers, body, signal: timeout.signal });
    return {
      status: res.status,
      statusText: res.statusText,
      contentType: res.headers.get('content-type') ?? '',
      retryAfter: res.headers.get('retry-after') ?? undefined,
      body: Buffer.from(await res.arrayBuffer()),
    };
  } finally {
    timeout.clear();
  }
}

/** A streamed complete's body: bytes, or a stream of them. */
export type StreamBody = Uint8Array | Readable | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

/** How long a streamed body may take to send, beyond a call's own timeout (as the Go SDK's). */
const STREAM_BODY_MS = 10 * 60_000;

/** An answer whose body is left to read: a success of a streamed call. */
interface StreamReply {
  status: number;
  statusText: string;
  headers: http.IncomingHttpHeaders;
  body: Readable;
}

/** body as a Node stream to pipe into a request. */
function readableOf(body: Exclude<StreamBody, Uint8Array>): Readable {
  if (body instanceof Readable) return body;
  if (body instanceof ReadableStream) return Readable.fromWeb(body as import('node:stream/web').ReadableStream<Uint8Array>);
  return Readable.from(body, { objectMode: false });
}

/**
 * One exchange through node:http whose body is a stream (or bytes) and
 * whose answer is left unread: it resolves with the answer's head, or
 * rejects when the exchange fails, no answer comes within ms, or signal
 * fires. Once the answer came, the time limit no longer applies (a large
 * body is read at its reader's pace). An answer that comes before the body
 * is all sent (a refusal) ends the sending.
 */
function sendStream(
  target: Target,
  method: string,
  path: string,
  headers: Record<string, string>,
  body: StreamBody | undefined,
  ms: number,
  signal: AbortSignal | undefined,
): Promise<StreamReply> {
  return exchange<StreamReply>(
    target,
    method,
    path,
    headers,
    ms,
    signal,
    (res, settle) => {
      res.on('error', settle);
      settle(undefined, { status: res.statusCode ?? 0, statusText: res.statusMessage ?? '', headers: res.headers, body: res });
    },
    (req, settle) => {
      if (body === undefined || body instanceof Uint8Array) {
        req.end(body);
        return;
      }
      // A source that fails destroys the request: idemsvc gets a broken
      // body and stores nothing.
      pipeline(readableOf(body), req, (err) => {
        if (err) settle(err);
      });
    },
  );
}

/** One exchange through a fetch given in the options, its answer left unread. */
async function fetchStream(
  fetch: typeof globalThis.fetch,
  url: string,
  method: string,
  headers: Record<string, string>,
  body: StreamBody | undefined,
  ms: number,
  signal: AbortSignal | undefined,
): Promise<StreamReply> {
  const timeout = timeoutSignal(ms, signal);
  try {
    let init: RequestInit & { duplex?: 'half' } = { method, headers, signal: timeout.signal };
    if (body instanceof Uint8Array) init.body = body;
    else if (body !== undefined) {
      // A stream goes as the request's own body, sent as it is read.
      const web = body instanceof ReadableStream ? body : (Readable.toWeb(readableOf(body)) as ReadableStream<Uint8Array>);
      init = { ...init, body: web, duplex: 'half' };
    }
    const res = await fetch(url, init);
    const out: http.IncomingHttpHeaders = {};
    res.headers.forEach((value, name) => (out[name] = value));
    const stream = res.body ? Readable.fromWeb(res.body as import('node:stream/web').ReadableStream<Uint8Array>) : Readable.from([]);
    return { status: res.status, statusText: res.statusText, headers: out, body: stream };
  } finally {
    timeout.clear();
  }
}

/** The whole of a (small) answer body. */
async function readAll(body: Readable): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of body) chunks.push(chunk as Buffer);
  return chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
}

/**
 * A stored body on its way: passed on as it comes, but for its last chunk,
 * held back until the body ended with the size and SHA-256 stated; then
 * passed on, or the stream errors with BodyMismatchError instead. A body
 * past its size errors at once.
 */
class CheckedBody extends Transform {
  private readonly hash = createHash('sha256');
  private seen = 0;
  private held: Buffer | undefined;

  constructor(
    private readonly size: number,
    private readonly digest: string | undefined,
  ) {
    super();
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, done: TransformCallback): void {
    this.hash.update(chunk);
    this.seen += chunk.length;
    if (this.size >= 0 && this.seen > this.size) return done(new BodyMismatchError());
    const held = this.held;
    this.held = chunk;
    done(null, held);
  }

  override _flush(done: TransformCallback): void {
    if ((this.size >= 0 && this.seen !== this.size) || (this.digest !== undefined && this.hash.digest('base64') !== this.digest)) {
      return done(new BodyMismatchError());
    }
    done(null, this.held);
  }
}

/** The IdemError of an answer that is not a success. */
function errorOf(op: string, reply: Reply): IdemError {
  const contentType = reply.contentType;
  let problem: Problem | undefined;
  let payload: unknown;
  try {
    payload = contentType.startsWith('application/') && contentType.includes('json') ? json(reply) : text(reply);
  } catch {
    // A body that is not what it says: the status is all there is.
  }
  if (contentType.startsWith('application/problem+json') && isProblem(payload)) problem = payload;
  problem ??= {
    ...problemOf('internal', 'an answer idemsvc does not document', reply.status),
    title: reply.statusText || `HTTP ${reply.status}`,
    type: '' as Problem['type'],
    code: '' as Problem['code'],
  };
  const seconds = Number(reply.retryAfter ?? '');
  const retryAfterMs = Number.isInteger(seconds) && seconds > 0 ? seconds * 1000 : undefined;
  // readyz's 503 is a readiness report, not a problem: it rides as the cause.
  return new IdemError(op, reply.status, problem, retryAfterMs, { cause: problem.type ? undefined : payload });
}

function isProblem(v: unknown): v is Problem {
  const type = typeof v === 'object' && v !== null ? (v as { type?: unknown }).type : undefined;
  return typeof type === 'string' && type !== '';
}

function json<T>(reply: Reply): T {
  return JSON.parse(reply.body.toString()) as T;
}

function text(reply: Reply): string {
  return reply.body.toString();
}

function drain(): void {}

/**
 * A signal that fires after ms or when parent fires. (AbortSignal.any would
 * do, but Node 18 lacks it.)
 */
function timeoutSignal(ms: number, parent?: AbortSignal): { signal: AbortSignal; clear: () => void } {
  const controller = new AbortController();
  const onAbort = () => controller.abort(parent?.reason);
  const timer = setTimeout(() => controller.abort(new DOMException(`no answer within ${ms} ms`, 'TimeoutError')), ms);
  parent?.addEventListener('abort', onAbort, { once: true });
  return {
    signal: controller.signal,
    clear: () => {
      clearTimeout(timer);
      parent?.removeEventListener('abort', onAbort);
    },
  };
}

/** msg cut to the 1,024 bytes of UTF-8 idemsvc takes, at a character boundary. */
function shortMessage(msg: string): string {
  if (msg.length <= MAX_ERROR_BYTES / 4 || Buffer.byteLength(msg) <= MAX_ERROR_BYTES) return msg;
  const bytes = Buffer.from(msg);
  let cut = MAX_ERROR_BYTES;
  while (cut > 0 && (bytes[cut]! & 0xc0) === 0x80) cut--;
  return bytes.toString('utf8', 0, cut);
}
