// SPDX-License-Identifier: Apache-2.0

// The API's types, shared by the client (client.ts) and doOnce (do.ts)
// without either importing the other: doOnce needs only the four calls of
// a lease (LeaseCalls), which IdemClient implements.

import type { components } from './schema.js';

type Schemas = components['schemas'];
/** A begin's fields; `owner` is made up per call when absent. */
export type BeginParams = Omit<Schemas['BeginRequest'], 'tenant'>;
/** A complete's fields. */
export type CompleteParams = Omit<Schemas['CompleteRequest'], 'tenant'>;
/**
 * A streamed complete's fields (`POST /v1/complete/stream`): the response
 * but its body, which goes as the request's own.
 */
export interface CompleteStreamParams {
  key: string;
  lease_token: string;
  status_code?: number;
  headers?: Record<string, string>;
  retention_s?: number;
  /**
   * The body's length in bytes, sent as its Content-Length when known;
   * without it a stream goes chunked. (Bytes carry their own.)
   */
  size?: number;
}
/** A fail's fields; `error` is cut to the 1,024 bytes idemsvc takes. */
export type FailParams = Omit<Schemas['FailRequest'], 'tenant'>;
/** An extend's fields. */
export type ExtendParams = Omit<Schemas['ExtendRequest'], 'tenant'>;
/** A begin that acquired the key: run the operation, then complete or fail. */
export type BeginAcquired = Schemas['BeginAcquired'];
/** A begin that found the key finished: replay its outcome, do not run the operation. */
export type BeginReplay = Schemas['BeginReplay'];
/** What begin answers; tell the two apart by `status` (`acquired`, or `completed`/`failed`). */
export type BeginResult = BeginAcquired | BeginReplay;
export type FinishResult = Schemas['FinishResult'];
export type Lease = Schemas['Lease'];
export type StatusRecord = Schemas['StatusRecord'];
export type KeyList = Schemas['KeyList'];
export type State = Schemas['State'];
export type Health = Schemas['Health'];
export type Readiness = Schemas['Readiness'];
/** One tenant's usage against its limits; see `IdemClient.usage`. */
export type TenantUsage = Schemas['TenantUsage'];

/** The parameters of one page of a listing. */
export interface ListParams {
  state: State;
  /** Only records whose last transition is at least this old. */
  older_than_s?: number;
  /** Records per page, 1 to 1000 (the server's default is 100). */
  limit?: number;
  /** The `next_cursor` of the page before. */
  cursor?: string;
}

/** Options of a single call. */
export interface CallOptions {
  /** Ends the call, and its retries, when it fires. */
  signal?: AbortSignal;
  /** Sent as X-Request-Id, so idemsvc's log lines can be matched with the caller's. */
  requestId?: string;
  /** @internal See {@link CALL_DEADLINE}. */
  [CALL_DEADLINE]?: number;
}

/**
 * The time (Date.now()) by which a call and its retries end, failing as
 * store-unavailable: the middleware's budget for a begin, without an
 * AbortController, a timer and the signal's listeners per request. Not
 * exported from the package.
 */
export const CALL_DEADLINE: unique symbol = Symbol('idemsvc call deadline');

/** The calls of one lease: what doOnce and the middleware need of a client. */
export interface LeaseCalls {
  begin(params: BeginParams, options?: CallOptions): Promise<BeginResult>;
  complete(params: CompleteParams, options?: CallOptions): Promise<FinishResult>;
  fail(params: FailParams, options?: CallOptions): Promise<FinishResult>;
  extend(params: ExtendParams, options?: CallOptions): Promise<Lease>;
}
