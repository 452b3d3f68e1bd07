// SPDX-License-Identifier: Apache-2.0

import { backoff, newOwner, sleep } from './retry.js';
import type { BeginAcquired, BeginReplay, LeaseCalls } from './types.js';
import { IdemError, isIdemError, problemOf, terminalOf, TerminalFailure } from './errors.js';
import { decodeResponse, encodeResponse, type IdemResponse } from './response.js';

/** Options of doOnce. Absent values take the defaults. */
export interface DoOptions {
  /** Compared with the key's first begin; a difference throws kind `fingerprint-mismatch`. */
  fingerprint?: string;
  /** The lease, extended every third of it while fn runs (default 30 s). */
  leaseMs?: number;
  /** How long the outcome is replayed (default: the service's, a day). */
  retentionS?: number;
  /** How long each begin waits for another caller's attempt (default 5 s). */
  waitMs?: number;
  /**
   * Ends the wait for another caller's attempt; while fn runs, it fires
   * fn's signal too. Once fn has returned, its outcome is stored whatever
   * this signal does.
   */
  signal?: AbortSignal;
}

/** Defaults of DoOptions. */
export const DEFAULT_LEASE_MS = 30_000;
export const DEFAULT_WAIT_MS = 5_000;

/** The header that marks a replay whose body was too large to store. */
export const BODY_OMITTED_HEADER = 'Idempotent-Body-Omitted';

/**
 * The operation doOnce runs. Its signal fires when the lease is lost (its
 * reason then an IdemError of kind `lease-lost`) or the caller's signal
 * fires: stop, as another caller may now run the operation. It returns the
 * response to store (nothing stores an empty one), or throws: a `Terminal`
 * is stored as a terminal failure, anything else releases the key.
 */
export type Operation = (signal: AbortSignal) => IdemResponse | void | Promise<IdemResponse | void>;

/** The outcome of doOnce: fn's, or the stored one of an earlier call. */
export interface DoResult {
  response: IdemResponse;
  /** fn did not run here: this is the stored outcome of an earlier call. */
  replayed: boolean;
  /** The attempt that produced the outcome. */
  attempt: number;
}

/**
 * Runs fn at most once for key, across every caller of idemsvc, and gives
 * every caller its outcome:
 *
 * - a key completed before is replayed without calling fn (`replayed`); a
 *   key that failed terminally throws its TerminalFailure, replayed;
 * - a key in progress elsewhere is waited for (each begin waits up to
 *   `waitMs`), and begun again with backoff until `options.signal` fires;
 * - otherwise fn runs, its lease extended every third of `leaseMs`, and
 *   its response is completed. A response idemsvc refuses to store (over
 *   its size limit) fails the attempt terminally instead, so that no
 *   duplicate runs fn again, and throws a TerminalFailure.
 *
 * fn throwing a {@link Terminal} stores a terminal failure and throws a
 * TerminalFailure; any other error releases the key (a retryable fail) and
 * is thrown again.
 */
export async function doOnce(client: LeaseCalls, key: string, fn: Operation, options: DoOptions = {}): Promise<DoResult> {
  const leaseMs = options.leaseMs && options.leaseMs > 0 ? options.leaseMs : DEFAULT_LEASE_MS;
  const waitMs = options.waitMs && options.waitMs > 0 ? options.waitMs : DEFAULT_WAIT_MS;
  const begin = {
    key,
    fingerprint: options.fingerprint || undefined,
    owner: newOwner(), // the same across this call's begins: a lost answer's lease comes back
    lease_ms: leaseMs,
    retention_s: options.retentionS,
    wait_ms: waitMs,
  };
  for (let attempt = 0; ; attempt++) {
    let res;
    try {
      res = await client.begin(begin, { signal: options.signal });
    } catch (err) {
      if (!isIdemError(err, 'in-progress')) throw err;
      await sleep(backoff(attempt), options.signal);
      continue;
    }
    if (res.status !== 'acquired') return replayed(res);
    return runUnderLease(client, res, { leaseMs, retentionS: options.retentionS, signal: options.signal }, (abort) => fn(abort.signal));
  }
}

/** The DoResult of a finished attempt's stored outcome; a terminal failure throws. */
function replayed(r: BeginReplay): DoResult {
  const response = decodeResponse(r.response);
  if (r.status === 'failed') throw new TerminalFailure(r.error ?? '', true, r.attempt, response);
  return { response, replayed: true, attempt: r.attempt };
}

/**
 * What fn gives runUnderLease when it stored the outcome itself (a
 * streamed complete): nothing is left to complete.
 */
export const STORED: unique symbol = Symbol('idemsvc stored');

/** How runUnderLease runs fn. */
export interface LeaseOptions {
  leaseMs: number;
  retentionS?: number | undefined;
  signal?: AbortSignal | undefined;
  /**
   * Stores a response too large to store as its status and headers, with
   * BODY_OMITTED_HEADER, instead of failing the attempt (middleware: a
   * caller whose first answer was lost still learns it succeeded).
   */
  omitBody?: boolean;
}

/**
 * An AbortController made only when its signal is first asked for: most
 * operations never look at theirs, and a controller (an EventTarget) costs
 * a request a few percent of the middleware's own CPU.
 */
export class LazyAbort {
  private controller: AbortController | undefined;
  private reason: unknown;
  aborted = false;

  get signal(): AbortSignal {
    if (this.controller === undefined) {
      this.controller = new AbortController();
      if (this.aborted) this.controller.abort(this.reason);
    }
    return this.controller.signal;
  }

  abort(reason?: unknown): void {
    if (this.aborted) return;
    this.aborted = true;
    this.reason = reason;
    this.controller?.abort(reason);
  }
}

/**
 * Runs fn under lease, extending it, and completes or fails the attempt.
 * fn gets its signal through a LazyAbort.
 */
export async function runUnderLease(
  client: LeaseCalls,
  lease: BeginAcquired,
  options: LeaseOptions,
  fn: (abort: LazyAbort) => Promise<IdemResponse | void | typeof STORED> | IdemResponse | void,
): Promise<DoResult> {
  const { key, lease_token, attempt } = lease;
  // fn's signal fires when the caller's does, or when the lease is lost;
  // the heartbeat goes on until fn settles either way, since fn may go on
  // running after the caller gave up, and the key must stay held meanwhile.
  const fnSignal = new LazyAbort();
  const onCallerAbort = () => fnSignal.abort(options.signal?.reason);
  if (options.signal?.aborted) onCallerAbort();
  options.signal?.addEventListener('abort', onCallerAbort, { once: true });
  const heartbeat = new Heartbeat(client, key, lease_token, options.leaseMs, (err) => fnSignal.abort(err));

  let outcome: IdemResponse | void | typeof STORED;
  try {
    outcome = await fn(fnSignal);
  } catch (err) {
    // The operation ran: its outcome is stored whatever the caller's signal does.
    await heartbeat.stop();
    options.signal?.removeEventListener('abort', onCallerAbort);
    // Whoever still holds fn's signal (a handler the middleware gave up on)
    // learns that the key is no longer held for it.
    if (!fnSignal.aborted) fnSignal.abort(leaseLost(err, `the attempt ended: ${messageOf(err)}`));
    const term = terminalOf(err);
    if (term !== undefined) {
      const stored = term.response ?? {};
      try {
        await client.fail({ key, lease_token, retryable: false, error: term.message, response: encodeResponse(stored) });
      } catch (failErr) {
        if (!isIdemError(failErr, 'too-large')) throw failErr;
        // Store the failure without its response rather than not at all.
        await client.fail({ key, lease_token, retryable: false, error: term.message });
      }
      throw new TerminalFailure(term.message, false, attempt, stored, { cause: err });
    }
    try {
      await client.fail({ key, lease_token, error: messageOf(err) });
    } catch {
      // The key stays held until the lease runs out; fn's error says more.
    }
    throw err;
  }
  await heartbeat.stop();
  options.signal?.removeEventListener('abort', onCallerAbort);
  if (outcome === STORED) return { response: {}, replayed: false, attempt };
  const response = outcome ?? {};

  const retention_s = options.retentionS;
  try {
    await client.complete({ key, lease_token, response: encodeResponse(response), retention_s });
  } catch (completeErr) {
    let err = completeErr;
    if (isIdemError(err, 'too-large') && options.omitBody) {
      const headers = { ...response.headers, [BODY_OMITTED_HEADER]: 'true' };
      try {
        const omitted: IdemResponse = response.statusCode === undefined ? { headers } : { statusCode: response.statusCode, headers };
        await client.complete({ key, lease_token, response: encodeResponse(omitted), retention_s });
        return { response, replayed: false, attempt };
      } catch (omitErr) {
        err = omitErr;
      }
    }
    if (!isIdemError(err, 'too-large', 'invalid-request')) throw err;
    // The operation ran but its outcome cannot be stored: a terminal
    // failure keeps duplicates from running it again.
    const message = `the response could not be stored: ${err.message}`;
    await client.fail({ key, lease_token, retryable: false, error: message });
    throw new TerminalFailure(message, false, attempt, response, { cause: err });
  }
  return { response, replayed: false, attempt };
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message || err.name : String(err);
}

/**
 * Extends a lease every third of it until stopped. When the lease is lost,
 * or cannot be extended before it runs out, it aborts `lost` with an
 * IdemError of kind `lease-lost`. It is one timer at a time: an operation
 * shorter than a third of the lease costs no call.
 */
class Heartbeat {
  private timer: ReturnType<typeof setTimeout>;
  private stopped = false;
  private isLost = false;
  private expiresAt: number; // of the lease, as last extended, on this clock: a little late at worst
  private inFlight: { abort: AbortController; done: Promise<void> } | undefined;

  constructor(
    private readonly client: LeaseCalls,
    private readonly key: string,
    private readonly token: string,
    private readonly leaseMs: number,
    private readonly onLost: (err: IdemError) => void,
  ) {
    this.expiresAt = Date.now() + leaseMs;
    this.timer = setTimeout(() => this.beat(), leaseMs / 3);
  }

  private beat(): void {
    if (this.stopped || this.isLost) return;
    const abort = new AbortController();
    // An extend that cannot end before the lease does is of no use.
    const deadline = setTimeout(() => abort.abort(), Math.max(0, this.expiresAt - Date.now()));
    const done = this.extend(abort.signal).finally(() => clearTimeout(deadline));
    this.inFlight = { abort, done };
  }

  private async extend(signal: AbortSignal): Promise<void> {
    const sent = Date.now();
    try {
      await this.client.extend({ key: this.key, lease_token: this.token, lease_ms: this.leaseMs }, { signal });
      this.expiresAt = sent + this.leaseMs;
    } catch (err) {
      if (this.stopped || this.isLost) return;
      if (isIdemError(err, 'lease-lost')) return this.lose(err);
      if (isIdemError(err, 'not-found')) return this.lose(leaseLost(err, 'the record is gone, and the lease with it'));
      if (Date.now() >= this.expiresAt) {
        return this.lose(leaseLost(err, `the lease was not extended before it ran out: ${messageOf(err)}`));
      }
    }
    if (!this.stopped) this.timer = setTimeout(() => this.beat(), this.leaseMs / 3);
  }

  private lose(err: IdemError): void {
    this.isLost = true;
    this.onLost(err);
  }

  /** Ends the heartbeat, cancelling an extend in flight, and waits for it. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.inFlight) {
      this.inFlight.abort.abort();
      await this.inFlight.done;
    }
  }
}

function leaseLost(cause: unknown, detail: string): IdemError {
  const status = cause instanceof IdemError ? cause.status : 0;
  return new IdemError('extend', status, problemOf('lease-lost', detail), undefined, { cause });
}
