// SPDX-License-Identifier: Apache-2.0

// The behaviour the Express middleware and the Fastify plugin share, as
// the Go SDK's middleware has it (clients/go/middleware.go): the key
// header's parsing, the fingerprint, the answers the middleware writes
// itself, and which of the handler's answers are stored.
import { isUtf8 } from 'node:buffer';
import { createHash, createHmac, type Hash } from 'node:crypto';
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import { PassThrough, type Readable } from 'node:stream';
import { CALL_DEADLINE } from './types.js';
import { apiKeyOf, type BeginAcquired, type CallOptions, type BeginResult, type BeginReplay, type IdemClient, type StatusRecord } from './client.js';
import { BODY_OMITTED_HEADER, DEFAULT_LEASE_MS, runUnderLease, STORED } from './do.js';
import { isIdemError, PROBLEM_KINDS, PROBLEM_TYPE_PREFIX, type ProblemKind } from './errors.js';
import { canonicalJson } from './jcs.js';
import { decodeResponse, toBuffer, type IdemResponse } from './response.js';

/**
 * Options of the Express middleware and the Fastify plugin. Absent values
 * take the defaults. Req is the framework's request.
 */
export interface IdempotencyOptions<Req = IncomingMessage> {
  /** The request header with the idempotency key (default `Idempotency-Key`). */
  keyHeader?: string;
  /** The methods made idempotent (default POST and PATCH), taken in upper case; others run every time, key or not. */
  methods?: string[];
  /** Lets requests of those methods without a key through, not idempotent; by default they get 400. */
  optional?: boolean;
  /**
   * The response headers stored and replayed (default Content-Type,
   * Content-Language, Location, ETag, Last-Modified); others reach only the
   * first caller.
   */
  headers?: string[];
  /** The lease, extended every third of it while the handler runs (default 30 s). */
  leaseMs?: number;
  /** How long answers are replayed (default: the service's, a day). */
  retentionS?: number;
  /** How long a duplicate waits for the attempt in progress before 409 (default 0). */
  waitMs?: number;
  /** Bounds the request body read for the fingerprint (default 1 MiB); a larger one gets 413. */
  maxBodyBytes?: number;
  /**
   * When idemsvc keeps large bodies in a blob store (`IDEMSVC_BLOB_URL`),
   * stores answers whose body is over 1 MiB (the most held) whole: from the
   * write that crosses it, the body goes to the caller and to idemsvc
   * (`POST /v1/complete/stream`) as the handler writes it, never held
   * whole, the handler going at the slower one's pace (`write` returns
   * false until both drained), up to this many bytes (at most idemsvc's
   * `IDEMSVC_MAX_STORED_BYTES`, 64 MiB by default); its replays stream it
   * back from `GET /v1/keys/body`, checked against its SHA-256. A body past
   * it is stored without its body, and a streamed complete that idemsvc
   * refuses fails the attempt retryably (the body cannot be sent again). 0
   * (the default) streams nothing: such answers are stored without their
   * body.
   */
  maxStreamedBodyBytes?: number;
  /**
   * Bounds the begin, retries included, before the middleware answers 503
   * (default 2 s, plus waitMs): on a request path, fail closed fast rather
   * than hold the caller while idemsvc or Redis is down.
   */
  budgetMs?: number;
  /**
   * Names the end user a request acts for: a stable subject from the
   * application's authentication (a user or account id, not a token that
   * rotates), read from the request after the authentication before the
   * middleware. It is part of the stored key, so another user's request
   * with the same key is another record: it never receives, waits on or is
   * refused because of this user's. Requests for which it gives "" or
   * nothing (anonymous ones) share one scope, and the credentials' digest
   * joins their fingerprint, as without a scope. Recommended wherever end
   * users send keys.
   */
  scope?: (req: Req) => string | undefined | null;
  /**
   * The cookies that identify the caller, beside the Authorization header.
   * Without a scope, a keyed digest of these credentials is part of the
   * fingerprint: another caller's request with the same key gets 422,
   * never the stored answer. (They are not part of the key: a retry after
   * a token refresh gets 422, not a second run.) A request without
   * credentials adds nothing.
   */
  credentialCookies?: string[];
  /**
   * Keys that digest (default: the client's API key). Give every replica of
   * a service the same one; give one explicitly to keep fingerprints across
   * an API key rotation.
   */
  credentialSecret?: string | Uint8Array;
  /**
   * Turns the scope and the credentials' digest off: any caller that knows
   * a key and its request gets its stored answer. Only for APIs whose
   * tenant at idemsvc has one caller (a service calling another). Refused
   * (the middleware throws) together with a scope, which it contradicts.
   */
  unscoped?: boolean;
  /**
   * After a fingerprint mismatch, look the record up (without acquiring
   * it) and replay it when it holds the fingerprint of earlier versions
   * (method, path, query and raw body, no credentials), so that records
   * stored before an upgrade replay until they expire (a day, by default),
   * to any caller with the same key and request, as they did before it
   * (default true).
   */
  legacyFingerprints?: boolean;
}

/** The header that marks a response replayed from idemsvc. */
export const REPLAYED_HEADER = 'Idempotent-Replayed';
const DEFAULT_MIDDLEWARE_BUDGET_MS = 2_000;
/** The most of an answer's body held to be stored: idemsvc's default stored-response limit. */
export const MAX_HELD_BODY_BYTES = 1 << 20;
const DEFAULT_STORED_HEADERS = ['Content-Type', 'Content-Language', 'Location', 'ETag', 'Last-Modified'];
const MAX_KEY_BYTES = 255;

/** IdempotencyOptions with every default filled in. */
export interface Settings {
  keyHeader: string;
  /** keyHeader in lower case, as Node names incoming headers. */
  keyHeaderLower: string;
  methods: ReadonlySet<string>;
  optional: boolean;
  /** The stored headers' names, as given. */
  storedHeaders: readonly string[];
  leaseMs: number;
  retentionS: number | undefined;
  waitMs: number;
  maxBodyBytes: number;
  maxStreamedBodyBytes: number;
  budgetMs: number;
  /** The scope, unless unscoped. */
  scope: ((req: never) => string | undefined | null) | undefined;
  /** Whether a request without a scope carries its credentials' digest. */
  withCredentials: boolean;
  credentialCookies: readonly string[];
  credentialKey: Buffer;
  legacyFingerprints: boolean;
}

export function settingsOf<Req>(client: IdemClient, options: IdempotencyOptions<Req> = {}): Settings {
  if (options.scope && options.unscoped) throw new TypeError('idemsvc: the scope and unscoped options contradict each other: set one');
  const keyHeader = options.keyHeader || 'Idempotency-Key';
  return {
    scope: options.scope as Settings['scope'],
    withCredentials: !options.unscoped,
    credentialCookies: options.credentialCookies ?? [],
    credentialKey: credentialKey(options.credentialSecret ?? apiKeyOf(client)),
    legacyFingerprints: options.legacyFingerprints ?? true,
    keyHeader,
    keyHeaderLower: keyHeader.toLowerCase(),
    methods: new Set((options.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase())),
    optional: options.optional ?? false,
    storedHeaders: options.headers ?? DEFAULT_STORED_HEADERS,
    leaseMs: options.leaseMs && options.leaseMs > 0 ? options.leaseMs : DEFAULT_LEASE_MS,
    retentionS: options.retentionS,
    waitMs: options.waitMs && options.waitMs > 0 ? options.waitMs : 0,
    maxBodyBytes: options.maxBodyBytes && options.maxBodyBytes > 0 ? options.maxBodyBytes : 1 << 20,
    maxStreamedBodyBytes: options.maxStreamedBodyBytes && options.maxStreamedBodyBytes > 0 ? options.maxStreamedBodyBytes : 0,
    budgetMs: options.budgetMs && options.budgetMs > 0 ? options.budgetMs : DEFAULT_MIDDLEWARE_BUDGET_MS,
  };
}

/** An answer the middleware writes itself: a problem or a replay. */
export interface Answer {
  status: number;
  headers: Record<string, string>;
  /** A stream for a replay whose body idemsvc keeps by reference: it errors (the answer is cut off) rather than end wrong. */
  body: Buffer | string | Readable;
}

/**
 * The key in the key header's value: one Structured Field String (RFC
 * 8941: `"abc"`, with `\"` and `\\` escapes, printable ASCII), or a bare
 * token, accepted as the same key for compatibility. An empty key, a
 * malformed string, several values (Node joins repeated headers with a
 * comma) and an over-long key give undefined.
 */
export function parseKey(header: string | string[]): string | undefined {
  if (Array.isArray(header)) {
    if (header.length !== 1) return undefined;
    header = header[0]!;
  }
  const v = header.trim();
  if (!v.startsWith('"')) {
    return v !== '' && v.length <= MAX_KEY_BYTES && !/[",\\]/.test(v) ? v : undefined;
  }
  let key = '';
  for (let i = 1; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c === 0x5c /* \ */) {
      const next = v[i + 1];
      if (next !== '"' && next !== '\\') return undefined;
      key += next;
      i++;
    } else if (c === 0x22 /* " */) {
      return i === v.length - 1 && key !== '' && key.length <= MAX_KEY_BYTES ? key : undefined;
    } else if (c < 0x20 || c > 0x7e) {
      return undefined;
    } else {
      key += v[i];
    }
  }
  return undefined; // no closing quote
}

const NUL = Buffer.from([0]);
const QUESTION = Buffer.from('?');

/** Marks the fingerprint's version: a record stored by an earlier version holds `sha256:…` (legacyFingerprint). */
const FINGERPRINT_PREFIX = 'v2:sha256:';

/**
 * The request's fingerprint, the Go middleware's bytes (so a key shared by
 * services in both languages matches): `v2:sha256:` and the hex SHA-256 of
 * the method, NUL, the decoded path (Go's URL.Path), `?`, the raw query, NUL,
 * the hex digest of the caller's credentials (empty without one), NUL, and
 * the body: the RFC 8785 canonical form of a JSON body (application/json,
 * application/*+json) that is one I-JSON value, the raw bytes of any other.
 */
export function fingerprint(method: string, url: string, body: Uint8Array, contentType?: string, credentials?: Buffer): string {
  let canonical: string | undefined;
  if (isJsonMediaType(contentType)) canonical = canonicalJson(body);
  // Few updates rather than one a part: each crosses into native code.
  const hash = withTarget(createHash('sha256'), method, url);
  if (credentials) hash.update(credentials.toString('hex'), 'latin1');
  return FINGERPRINT_PREFIX + hash.update(NUL).update(canonical ?? body).digest('hex');
}

/**
 * The fingerprint of versions before fingerprints had a version: the hex
 * SHA-256 of the method, path, query and raw body, as `sha256:<hex>`. The
 * middleware begins with it after a mismatch, so that records stored by
 * those versions replay until they expire.
 */
export function legacyFingerprint(method: string, url: string, body: Uint8Array): string {
  return 'sha256:' + withTarget(createHash('sha256'), method, url).update(body).digest('hex');
}

/**
 * hash, updated with the method, NUL, the decoded path, `?`, the raw query
 * and NUL: in one update of a latin1 string (one byte a character, as Node
 * holds the request target) when the method is ASCII and the path has no
 * escape, the common case.
 */
function withTarget(hash: Hash, method: string, url: string): Hash {
  const q = url.indexOf('?');
  const rawPath = q < 0 ? url : url.slice(0, q);
  const rawQuery = q < 0 ? '' : url.slice(q + 1);
  if (!rawPath.includes('%') && ASCII.test(method)) return hash.update(method + '\0' + rawPath + '?' + rawQuery + '\0', 'latin1');
  return hash.update(method).update(NUL).update(percentDecode(rawPath)).update(QUESTION).update(rawQuery, 'latin1').update(NUL);
}

const ASCII = /^[\x00-\x7f]*$/;

/** Whether a Content-Type names JSON: application/json or application/<anything>+json, in any case, with or without parameters. */
export function isJsonMediaType(contentType: string | undefined): boolean {
  if (!contentType) return false;
  const semi = contentType.indexOf(';');
  const mediaType = (semi < 0 ? contentType : contentType.slice(0, semi)).replace(/^[ \t]+|[ \t]+$/g, '').toLowerCase();
  if (!mediaType.startsWith('application/')) return false;
  const sub = mediaType.slice('application/'.length);
  return sub === 'json' || (sub.endsWith('+json') && sub.length > '+json'.length);
}

/**
 * The key of the credentials' digest: HMAC-SHA256 of a label under the
 * secret (by default the client's API key), the same on every replica of a
 * service and meaningless to idemsvc.
 */
export function credentialKey(secret: string | Uint8Array): Buffer {
  return createHmac('sha256', secret).update('idemsvc middleware credentials').digest();
}

/**
 * An HMAC-SHA256, under key, of the request's credentials: the
 * Authorization header's value, then, for each cookie name in cookies and
 * each cookie of that name in the Cookie header in order, NUL, name, `=`
 * and value. Undefined for a request that carries none of them.
 */
export function credentialDigest(headers: IncomingHttpHeaders, key: Buffer, cookies: readonly string[]): Buffer | undefined {
  let mac: ReturnType<typeof createHmac> | undefined;
  const write = (s: string) => (mac ??= createHmac('sha256', key)).update(s);
  const auth = headers.authorization;
  if (auth) write(auth);
  const header = headers.cookie;
  if (cookies.length > 0 && header) {
    const pairs = header.split(';');
    for (const name of cookies) {
      for (const pair of pairs) {
        const trimmed = pair.replace(/^[ \t]+|[ \t]+$/g, '');
        const eq = trimmed.indexOf('=');
        if (eq >= 0 && trimmed.slice(0, eq) === name) write(`\0${name}=${trimmed.slice(eq + 1)}`);
      }
    }
  }
  return mac?.digest();
}

/**
 * The key stored for client key key of the end user scope: `~`, the
 * unpadded base64url SHA-256 of the scope, `~` and the key; or, when that
 * would be over idemsvc's 255 bytes, `#` and the key's own digest in place
 * of `~` and the key. Undefined for a key with a byte idemsvc refuses
 * (outside visible ASCII).
 */
export function scopedKey(scope: string, key: string): string | undefined {
  if (/[^\x21-\x7e]/.test(key)) return undefined;
  const prefix = '~' + createHash('sha256').update(scope).digest('base64url');
  if (prefix.length + 1 + key.length <= MAX_KEY_BYTES) return `${prefix}~${key}`;
  return `${prefix}#${createHash('sha256').update(key).digest('base64url')}`;
}

/** What a request is begun as: its stored key and fingerprint, and the legacy fingerprint to try after a mismatch. */
export interface RequestIdentity {
  key: string;
  fingerprint: string;
  legacyFingerprint: (() => string) | undefined;
}

/**
 * The identity of a request with client key key, or the 400 answer for a
 * key that cannot be scoped. scopeOf runs the application's scope.
 */
export function identify(
  settings: Settings,
  key: string,
  method: string,
  url: string,
  headers: IncomingHttpHeaders,
  body: Buffer,
  scopeOf: () => string | undefined | null,
): RequestIdentity | Answer {
  let withCredentials = settings.withCredentials;
  if (settings.scope) {
    const scope = scopeOf() ?? '';
    withCredentials = scope === '';
    const scoped = scopedKey(scope, key);
    if (scoped === undefined) return problemAnswer('invalid-request', 'idempotency key: key must be visible ASCII (0x21-0x7E)');
    key = scoped;
  }
  const credentials = withCredentials ? credentialDigest(headers, settings.credentialKey, settings.credentialCookies) : undefined;
  const contentType = headers['content-type'];
  return {
    key,
    fingerprint: fingerprint(method, url, body, contentType, credentials),
    legacyFingerprint: settings.legacyFingerprints && !settings.scope ? () => legacyFingerprint(method, url, body) : undefined,
  };
}

/** The bytes of a path with its %XX escapes decoded, as Go's URL.Path holds them. */
function percentDecode(path: string): Buffer {
  const raw = Buffer.from(path, 'latin1');
  if (!raw.includes(0x25 /* % */)) return raw;
  const out = Buffer.allocUnsafe(raw.length);
  let n = 0;
  for (let i = 0; i < raw.length; i++) {
    const hi = hexValue(raw[i + 1]);
    const lo = hexValue(raw[i + 2]);
    if (raw[i] === 0x25 && hi >= 0 && lo >= 0) {
      out[n++] = (hi << 4) | lo;
      i += 2;
    } else {
      out[n++] = raw[i]!;
    }
  }
  return out.subarray(0, n);
}

function hexValue(c: number | undefined): number {
  if (c === undefined) return -1;
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x41 && c <= 0x46) return c - 0x37;
  if (c >= 0x61 && c <= 0x66) return c - 0x57;
  return -1;
}

/**
 * Begins the request's key within the middleware's budget. After a
 * fingerprint mismatch, perhaps with a record stored before fingerprints
 * had a version, the answer is legacyAnswer's.
 */
export async function beginRequest(
  client: IdemClient,
  settings: Settings,
  id: RequestIdentity,
  requestId: string | undefined,
): Promise<BeginResult | Answer> {
  // A deadline the client keeps (each attempt's timeout cut to it, no retry
  // past it), not an AbortController and a timer per request.
  const options = { [CALL_DEADLINE]: Date.now() + settings.budgetMs + settings.waitMs, requestId };
  try {
    return await client.begin(
      { key: id.key, fingerprint: id.fingerprint, lease_ms: settings.leaseMs, retention_s: settings.retentionS, wait_ms: settings.waitMs || undefined },
      options,
    );
  } catch (err) {
    if (!id.legacyFingerprint || !isIdemError(err, 'fingerprint-mismatch')) throw err;
    return await legacyAnswer(client, id.key, id.legacyFingerprint(), options);
  }
}

/**
 * The answer to a request whose fingerprint its key's record does not hold:
 * the record's stored answer when it holds legacy, the request's
 * fingerprint of earlier versions, and 422 otherwise (409 while it is in
 * progress). It reads the record without acquiring it, so the legacy
 * fingerprint never gets into a new record (where it would replay to any
 * caller): a record that expired since the begin is not begun again.
 */
async function legacyAnswer(client: IdemClient, key: string, legacy: string, options: CallOptions): Promise<Answer> {
  let record: StatusRecord;
  try {
    record = await client.status(key, { ...options, includeResponse: true });
  } catch (err) {
    if (isIdemError(err, 'not-found')) return mismatchAnswer();
    throw err;
  }
  if (record.fingerprint !== legacy) return mismatchAnswer();
  const response = record.response ?? {};
  if (record.state === 'completed' || (record.state === 'failed' && record.retryable === false)) {
    return replayOf(client, { attempt: record.attempt, key: record.key, status: record.state, response, error: record.error });
  }
  if (record.state === 'in_progress') {
    const ms = record.lease_expires_at ? Date.parse(record.lease_expires_at) - Date.now() : 0;
    return problemAnswer('in-progress', 'a request with this idempotency key is in progress', Math.max(1, Math.ceil(ms / 1000)));
  }
  return mismatchAnswer(); // a retryable failure: a new attempt would acquire it
}

/**
 * Whether an answer is not to be stored, so that a retry runs the handler
 * again: a server error, 408 Request Timeout and 429 Too Many Requests say
 * the request may succeed later.
 */
export function retryAgain(status: number): boolean {
  return status >= 500 || status === 408 || status === 429;
}

/**
 * The response to store: the status, the allow-listed headers, the body.
 * Without the body (and with BODY_OMITTED_HEADER) when it was too large to
 * hold: its replays then say so, rather than failing the attempt.
 */
function storedResponse(status: number, header: (name: string) => unknown, body: Buffer, omitBody: boolean, settings: Settings): IdemResponse {
  const headers = storedHeaders(header, settings);
  if (omitBody) return { statusCode: status, headers: { ...headers, [BODY_OMITTED_HEADER]: 'true' } };
  // Text is stored as text, anything else in base64 (the API takes only UTF-8 text).
  const text = utf8(body);
  return { statusCode: status, headers, body: text ?? body };
}

/** The allow-listed headers of the answer, as stored. */
function storedHeaders(header: (name: string) => unknown, settings: Settings): Record<string, string> | undefined {
  let headers: Record<string, string> | undefined;
  for (const name of settings.storedHeaders) {
    let value = header(name);
    if (Array.isArray(value)) value = value.join(', ');
    if (value === undefined || value === null || value === '') continue;
    headers ??= {};
    headers[name] = String(value);
  }
  return headers;
}

/** b as a string when it is valid UTF-8 (a BOM kept). */
function utf8(b: Buffer): string | undefined {
  return isUtf8(b) ? b.toString('utf8') : undefined;
}

/** The answer for a begin that did not acquire the key and did not replay. */
export function beginErrorAnswer(err: unknown): Answer {
  if (isIdemError(err, 'in-progress')) {
    const retryAfter = err.retryAfterMs ? Math.floor(err.retryAfterMs / 1000) : 1;
    return problemAnswer('in-progress', 'a request with this idempotency key is in progress', retryAfter);
  }
  if (isIdemError(err, 'fingerprint-mismatch')) return mismatchAnswer();
  if (isIdemError(err, 'rate-limited', 'quota-exceeded')) {
    // Over this service's limits at idemsvc: the handler did not run.
    const retryAfter = Math.max(1, Math.floor((err.retryAfterMs ?? 0) / 1000));
    return problemAnswer(err.kind, 'this service is over its limits at the idempotency service', retryAfter);
  }
  if (isIdemError(err, 'invalid-request')) {
    return problemAnswer('invalid-request', `idempotency key: ${err.problem.detail}`);
  }
  if (isIdemError(err, 'unauthorized', 'forbidden')) {
    // A misconfigured API key: retrying will not help.
    return problemAnswer('internal', "the idempotency service refused this service's credentials");
  }
  // Fail closed: without idemsvc, nothing may run.
  return problemAnswer('store-unavailable', 'the idempotency service cannot be reached', 1);
}

/** The answer to a key used for another request. */
function mismatchAnswer(): Answer {
  return problemAnswer('fingerprint-mismatch', 'the idempotency key was used for another request');
}

/** The answer that replays a finished attempt's stored response. */
export function replayAnswer(replay: BeginReplay): Answer {
  let response: IdemResponse;
  try {
    response = decodeResponse(replay.response);
  } catch {
    return problemAnswer('internal', 'the stored response cannot be decoded');
  }
  if (replay.status === 'failed' && response.statusCode === undefined) {
    // A failure stored without a response: the operation ran, and its
    // outcome is unknown here.
    const answer = problemAnswer('internal', 'the first request with this idempotency key failed');
    answer.headers[REPLAYED_HEADER] = 'true';
    return answer;
  }
  const body = response.body === undefined ? '' : typeof response.body === 'string' ? response.body : toBuffer(response.body);
  const headers: Record<string, string> = { ...response.headers, [REPLAYED_HEADER]: 'true' };
  return { status: response.statusCode ?? 200, headers, body };
}

/**
 * The answer that replays a finished attempt: replayAnswer's, or for a
 * body idemsvc keeps by reference (`body_ref`), its status and headers
 * with its Content-Length and the body streamed from idemsvc, checked
 * against its SHA-256 as it goes (it errors before its end, cutting the
 * answer off, rather than end wrong). A body that cannot be fetched (its
 * object missing, say) answers 503 before anything is written, as idemsvc
 * unreachable does.
 */
export function replayOf(client: IdemClient, replay: BeginReplay): Answer | Promise<Answer> {
  if (replay.response?.body_ref === undefined) return replayAnswer(replay);
  return streamedReplay(client, replay);
}

async function streamedReplay(client: IdemClient, replay: BeginReplay): Promise<Answer> {
  let opened: { body: Readable; size: number };
  try {
    opened = await client.openBody(replay.key);
  } catch (err) {
    return beginErrorAnswer(err);
  }
  const answer = replayAnswer(replay);
  answer.headers['Content-Length'] = String(opened.size);
  answer.body = opened.body;
  return answer;
}

/** A problem answer, byte for byte as the Go middleware writes it. */
export function problemAnswer(kind: ProblemKind, detail: string, retryAfterSeconds = 0): Answer {
  const { status, title } = PROBLEM_KINDS[kind];
  const headers: Record<string, string> = { 'Content-Type': 'application/problem+json' };
  if (retryAfterSeconds > 0) headers['Retry-After'] = String(retryAfterSeconds);
  // encoding/json's field order and escapes, and its trailing newline.
  const body =
    JSON.stringify({ code: kind, detail, status, title, type: PROBLEM_TYPE_PREFIX + kind }).replace(
      /[<>&\u2028\u2029]/g,
      (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
    ) + '\n';
  return { status, headers, body };
}

/** The answer to a request without a key, or with one the middleware refuses. */
export function keyProblem(settings: Settings, missing: boolean): Answer {
  return missing
    ? problemAnswer('invalid-request', `the ${settings.keyHeader} header is required`)
    : problemAnswer(
        'invalid-request',
        `the ${settings.keyHeader} header must be one non-empty Structured Field String of at most 255 characters, such as "8e03978e"`,
      );
}

/** The answer to a request body over the limit. */
export function tooLargeAnswer(): Answer {
  return problemAnswer('too-large', 'the request body is too large to be made idempotent');
}

/** What the middleware tells the handler of a request it runs under a lease. */
export interface IdempotencyContext {
  /** The key stored at idemsvc: the request's key, scoped to the end user when a scope is set. */
  key: string;
  /** The attempt, strictly increasing per key: a fencing token for the handler's own storage. */
  attempt: number;
  /** Fires when the lease is lost: another request may now run the handler for this key. */
  signal: AbortSignal;
}

/** The handler's answer, as the entry point captured it. */
export interface HandlerAnswer {
  status: number;
  /** The body held; empty when streamed. */
  body: Buffer;
  /** The body went to the caller as it was written, too large to hold. */
  streamed: boolean;
}

/**
 * Begins the key of a request: the lease to run the handler under, or the
 * answer to send instead (a replay, or a problem). A key acquired for a
 * caller that left meanwhile (during a wait, say) is released at once:
 * the handler is not run for nobody.
 */
export async function acquire(
  client: IdemClient,
  settings: Settings,
  id: RequestIdentity,
  requestId: unknown,
  res: ServerResponse,
): Promise<BeginAcquired | Answer> {
  let begun: BeginResult | Answer;
  try {
    begun = await beginRequest(client, settings, id, typeof requestId === 'string' ? requestId : undefined);
  } catch (err) {
    return beginErrorAnswer(err);
  }
  if (typeof begun.status === 'number') return begun as Answer;
  if (begun.status !== 'acquired') return replayOf(client, begun);
  if (res.destroyed || res.socket?.destroyed) {
    try {
      await client.fail({ key: begun.key, lease_token: begun.lease_token, error: 'the caller left before the handler ran' });
    } catch {
      // The lease runs out on its own.
    }
    return problemAnswer('internal', 'the caller left before the handler ran');
  }
  return begun;
}

/**
 * Stores the handler's answer under lease, extending it while the handler
 * runs; the handler finds its IdempotencyContext through setContext. A
 * 5xx, 408 or 429 is not stored (the key is released for a retry), nor is
 * an answer that never came. The promise does not reject: the handler ran,
 * and its caller gets its answer whether or not storing it worked.
 *
 * When res closes before the answer, the caller left, and the handler may
 * still be running: releasing the key at once would let the caller's retry
 * run it alongside. The key stays held, and an answer given within a lease
 * is stored for the retry; after that the handler is taken for one that
 * never answers, its signal fires, and the attempt fails retryably.
 */
export function storeAnswer(
  client: IdemClient,
  settings: Settings,
  lease: BeginAcquired,
  res: ServerResponse,
  header: (name: string) => unknown,
  setContext: (context: IdempotencyContext) => void,
): { answer: PendingAnswer; stored: Promise<unknown> } {
  const answer: PendingAnswer = deferred<HandlerAnswer>();
  res.on('close', () => {
    if (answer.settled) return;
    const timer = setTimeout(() => answer.reject(new Error('the caller left, and the handler did not answer within a lease')), settings.leaseMs);
    timer.unref();
    answer.promise.then(() => clearTimeout(timer), () => clearTimeout(timer));
  });
  const stored = runUnderLease(client, lease, { leaseMs: settings.leaseMs, retentionS: settings.retentionS, omitBody: true }, async (abort) => {
    // The signal is made when the handler first reads it.
    setContext({
      key: lease.key,
      attempt: lease.attempt,
      get signal() {
        return abort.signal;
      },
    });
    let handled: HandlerAnswer;
    try {
      handled = await answer.promise;
    } catch (err) {
      answer.stream?.abort(err as Error);
      throw err;
    }
    const { status, body, streamed } = handled;
    if (answer.stream !== undefined) {
      // Stored by the stream, unless it failed: past its bound, stored
      // without the body; else the attempt fails, retryably.
      const err = await answer.stream.finish();
      if (err === undefined) return STORED;
      if (err !== STREAM_TOO_LARGE) throw new Error(`the streamed answer could not be stored: ${(err as Error).message ?? String(err)}`, { cause: err });
    }
    if (retryAgain(status)) throw new Error(`the handler answered ${status}`);
    return storedResponse(status, header, body, streamed || body.length > MAX_HELD_BODY_BYTES, settings);
  }).catch(() => undefined);
  return { answer, stored };
}

/** The handler's answer to come, and the stream storing its body when it is large. */
export interface PendingAnswer extends Deferred<HandlerAnswer> {
  stream?: BodyStream;
}

/**
 * Starts storing a large answer's body as the handler writes it, when
 * streaming is on (maxStreamedBodyBytes) and the status is one to store;
 * undefined otherwise. header reads the answer's headers, as sent.
 */
export function startBodyStream(
  client: IdemClient,
  settings: Settings,
  lease: BeginAcquired,
  answer: PendingAnswer,
  status: number,
  header: (name: string) => unknown,
): BodyStream | undefined {
  if (settings.maxStreamedBodyBytes <= 0 || retryAgain(status) || answer.stream !== undefined) return undefined;
  answer.stream = new BodyStream(client, settings, lease, status, storedHeaders(header, settings));
  return answer.stream;
}

/** Why a stream stopped: its body passed maxStreamedBodyBytes. */
const STREAM_TOO_LARGE = new Error('the streamed body is over maxStreamedBodyBytes');

/**
 * A large answer's body on its way to idemsvc (POST /v1/complete/stream)
 * as the handler writes it: through a pipe of 64 KiB, so that nothing is
 * held but what idemsvc has not read yet. Past maxStreamedBodyBytes, or
 * once the complete ended (refused), it is broken: writes go nowhere.
 */
export class BodyStream {
  private readonly pipe = new PassThrough({ highWaterMark: 64 << 10 });
  private written = 0;
  private broken = false;
  private failure: unknown;
  private readonly done: Promise<void>;
  private readonly max: number;
  /** Called when the pipe can take more after write said it could not, or broke. */
  onFree: (() => void) | undefined;

  constructor(client: IdemClient, settings: Settings, lease: BeginAcquired, status: number, headers: Record<string, string> | undefined) {
    this.pipe.on('error', () => undefined); // the complete's outcome says it
    this.pipe.on('drain', () => this.onFree?.());
    const params = { key: lease.key, lease_token: lease.lease_token, status_code: status, headers, retention_s: settings.retentionS };
    this.max = settings.maxStreamedBodyBytes;
    this.done = client.completeStream(params, this.pipe).then(
      () => undefined,
      (err: unknown) => {
        this.failure ??= err;
        this.break();
      },
    );
  }

  /** Passes b on; false while the pipe is full (onFree says when it is not). */
  write(b: Buffer): boolean {
    if (this.broken) return true;
    this.written += b.length;
    if (this.written > this.max) {
      this.abort(STREAM_TOO_LARGE);
      return true;
    }
    return this.pipe.write(b);
  }

  /** Whether write would wait: the pipe is full. */
  get full(): boolean {
    return !this.broken && this.pipe.writableNeedDrain;
  }

  /** Ends the stream with err: nothing is stored by it. */
  abort(err: Error): void {
    if (this.broken) return;
    this.failure = err;
    this.pipe.destroy(err);
    this.break();
  }

  private break(): void {
    if (this.broken) return;
    this.broken = true;
    this.onFree?.();
  }

  /** Ends the body; the complete's outcome: undefined when stored, else why not. */
  async finish(): Promise<unknown> {
    if (!this.broken) this.pipe.end();
    await this.done;
    return this.failure;
  }
}

/** A promise with its resolve and reject at hand. */
export interface Deferred<T> {
  promise: Promise<T>;
  resolve: (value: T) => void;
  reject: (err: Error) => void;
  /** Whether resolve or reject was called. */
  settled: boolean;
}

export function deferred<T>(): Deferred<T> {
  const d = { settled: false } as Deferred<T>;
  d.promise = new Promise<T>((res, rej) => {
    d.resolve = (value) => ((d.settled = true), res(value));
    d.reject = (err) => ((d.settled = true), rej(err));
  });
  d.promise.catch(() => undefined); // the run handles a rejection
  return d;
}
