// SPDX-License-Identifier: Apache-2.0

import type { IdemResponse } from './response.js';
import type { components } from './schema.js';

/** An RFC 9457 problem detail, as idemsvc answers it. */
export type Problem = components['schemas']['Problem'];

/** The URI prefix of every problem type idemsvc answers. */
export const PROBLEM_TYPE_PREFIX = 'https://idemsvc.dev/problems/';

/**
 * The kind of a problem: the last path segment of its `type` URI, one of the
 * 14 kinds the API documents (`in-progress`, `lease-lost`, ...).
 */
export type ProblemKind = Problem['type'] extends `${typeof PROBLEM_TYPE_PREFIX}${infer Kind}` ? Kind : never;

/** Every problem kind with its status and title, as idemsvc answers them. */
export const PROBLEM_KINDS: { readonly [K in ProblemKind]: { readonly status: number; readonly title: string } } = {
  'invalid-request': { status: 400, title: 'Invalid request' },
  unauthorized: { status: 401, title: 'Unauthorized' },
  forbidden: { status: 403, title: 'Forbidden' },
  'not-found': { status: 404, title: 'Not found' },
  'method-not-allowed': { status: 405, title: 'Method not allowed' },
  'unsupported-media-type': { status: 415, title: 'Unsupported media type' },
  'too-large': { status: 413, title: 'Too large' },
  'in-progress': { status: 409, title: 'In progress' },
  'lease-lost': { status: 409, title: 'Lease lost' },
  'fingerprint-mismatch': { status: 422, title: 'Fingerprint mismatch' },
  'rate-limited': { status: 429, title: 'Rate limited' },
  'quota-exceeded': { status: 429, title: 'Quota exceeded' },
  'store-unavailable': { status: 503, title: 'Store unavailable' },
  'blob-unavailable': { status: 503, title: 'Blob unavailable' },
  internal: { status: 500, title: 'Internal error' },
};

function isKind(name: string): name is ProblemKind {
  return Object.prototype.hasOwnProperty.call(PROBLEM_KINDS, name);
}

/**
 * The kind of an answer that carries no problem idemsvc documents (a
 * proxy's error page, say), from its status alone. Status 0 means no
 * answer came at all.
 */
function kindOfStatus(status: number): ProblemKind {
  switch (status) {
    case 0:
    case 502:
    case 503:
    case 504:
      return 'store-unavailable';
    case 400:
      return 'invalid-request';
    case 401:
      return 'unauthorized';
    case 403:
      return 'forbidden';
    case 404:
      return 'not-found';
    case 405:
      return 'method-not-allowed';
    case 413:
      return 'too-large';
    case 415:
      return 'unsupported-media-type';
    case 422:
      return 'fingerprint-mismatch';
    case 429:
      return 'rate-limited';
    default:
      return 'internal';
  }
}

/** The problem kind a problem's `code` names; undefined without one (an idemsvc older than codes). */
function kindOfCode(code: string | undefined): ProblemKind | undefined {
  return typeof code === 'string' && isKind(code) ? code : undefined;
}

/**
 * The problem kind named by a problem's `type`: its last path segment, as
 * the contract says; undefined for a URI that names no kind.
 */
function kindOfType(type: string): ProblemKind | undefined {
  const name = type.slice(type.lastIndexOf('/') + 1);
  return isKind(name) ? name : undefined;
}

/**
 * A call to idemsvc that failed: a problem it answered, or no answer at all
 * (`status` 0, kind `store-unavailable`, the network error as `cause`),
 * after the retries that were safe to make. Decide on `kind`, never on the
 * message.
 */
export class IdemError extends Error {
  /** The problem's kind, e.g. `in-progress` or `lease-lost`. */
  readonly kind: ProblemKind;
  /** The answer's HTTP status; 0 when idemsvc could not be reached. */
  readonly status: number;
  /** The problem detail; made up from the status when the answer carried none. */
  readonly problem: Problem;
  /** The answer's Retry-After, in milliseconds, when it had one. */
  readonly retryAfterMs: number | undefined;
  /** The call that failed: `begin`, `complete`, `fail`, `extend`, `status`, `delete`, `list`... */
  readonly op: string;

  constructor(op: string, status: number, problem: Problem, retryAfterMs?: number, options?: { cause?: unknown }) {
    const what = status === 0 ? 'unreachable' : `${status} ${problem.title}`;
    super(`idem: ${op}: ${what}: ${problem.detail}`, options);
    this.name = 'IdemError';
    this.op = op;
    this.status = status;
    this.problem = problem;
    this.kind = kindOfCode(problem.code) ?? kindOfType(problem.type) ?? kindOfStatus(status);
    this.retryAfterMs = retryAfterMs;
  }
}

/** Whether err is an IdemError of one of the kinds. */
export function isIdemError(err: unknown, ...kinds: ProblemKind[]): err is IdemError {
  return err instanceof IdemError && (kinds.length === 0 || kinds.includes(err.kind));
}

/** A problem of kind with detail, shaped as idemsvc writes them. */
export function problemOf(kind: ProblemKind, detail: string, status: number = PROBLEM_KINDS[kind].status): Problem {
  return { type: `${PROBLEM_TYPE_PREFIX}${kind}` as Problem['type'], code: kind, title: PROBLEM_KINDS[kind].title, status, detail };
}

const TERMINAL = Symbol.for('@idemsvc/client.Terminal');

/**
 * Marks an error as a terminal failure: `doOnce` stores it (with
 * `response`, if given, to replay) and every later call for the key gets
 * it back instead of running the operation. Unmarked errors are retryable:
 * the key is released for the next caller.
 *
 * @example
 * throw new Terminal(new Error('card declined'), { statusCode: 402, body: '{"error":"declined"}' });
 */
export class Terminal extends Error {
  /** What to replay for the failure, if anything. */
  readonly response: IdemResponse | undefined;
  /** Marks a Terminal across copies of this package: see {@link terminalOf}. */
  readonly [TERMINAL] = true;

  constructor(cause: unknown, response?: IdemResponse) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
    this.name = 'Terminal';
    this.response = response;
  }
}

/**
 * The Terminal that err is or wraps (in its `cause` chain, as Go's
 * errors.As looks), from this copy of the package or another; undefined
 * when err is retryable.
 */
export function terminalOf(err: unknown): Terminal | undefined {
  for (let e = err, depth = 0; e instanceof Object && depth < 32; e = (e as { cause?: unknown }).cause, depth++) {
    if ((e as { [TERMINAL]?: boolean })[TERMINAL] === true) return e as Terminal;
  }
  return undefined;
}

/** `terminal(err)` is `new Terminal(err)`. */
export function terminal(cause: unknown, response?: IdemResponse): Terminal {
  return new Terminal(cause, response);
}

/**
 * A terminal failure of a key: stored just now (the operation threw a
 * `Terminal`, which is the `cause`), or replayed from an earlier call
 * (`replayed`), with the stored message and response.
 */
export class TerminalFailure extends Error {
  constructor(
    message: string,
    /** The operation did not run here: this is an earlier call's outcome. */
    readonly replayed: boolean,
    /** The attempt that failed. */
    readonly attempt: number,
    /** The response stored with the failure, if any. */
    readonly response: IdemResponse,
    options?: { cause?: unknown },
  ) {
    super(`idem: failed terminally: ${message}`, options);
    this.name = 'TerminalFailure';
  }
}

/**
 * A streamed stored body whose bytes are not the stored ones (their size
 * or SHA-256 differ): a broken stream, never to be taken as the answer.
 */
export class BodyMismatchError extends Error {
  constructor(options?: ErrorOptions) {
    super('idem: the stored body does not match its SHA-256', options);
    this.name = 'BodyMismatchError';
  }
}
