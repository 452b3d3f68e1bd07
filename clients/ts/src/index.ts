// SPDX-License-Identifier: Apache-2.0

/**
 * The TypeScript client of idemsvc, the idempotency service: it makes an
 * operation run at most once per idempotency key and replays the stored
 * outcome to every duplicate.
 *
 * - `IdemClient` makes the API's calls (begin, complete, fail, extend,
 *   status, delete, listKeys...), retrying where that is safe.
 * - `client.doOnce(key, fn)` runs a function at most once per key, for
 *   message consumers and jobs, extending the lease while it runs.
 * - `@idemsvc/client/express` and `@idemsvc/client/fastify` make HTTP
 *   routes idempotent per the Idempotency-Key header draft.
 *
 * @module
 */
export {
  IdemClient,
  VERSION,
  DEFAULT_CALL_TIMEOUT_MS,
  DEFAULT_RETRY_BUDGET_MS,
  type IdemClientOptions,
  type CallOptions,
  type BeginParams,
  type BeginResult,
  type BeginAcquired,
  type BeginReplay,
  type CompleteParams,
  type CompleteStreamParams,
  type StreamBody,
  type FailParams,
  type ExtendParams,
  type FinishResult,
  type Lease,
  type StatusRecord,
  type KeyList,
  type ListParams,
  type State,
  type Health,
  type Readiness,
  type TenantUsage,
} from './client.js';
export { doOnce, DEFAULT_LEASE_MS, DEFAULT_WAIT_MS, BODY_OMITTED_HEADER, type DoOptions, type DoResult, type Operation } from './do.js';
export {
  IdemError,
  BodyMismatchError,
  isIdemError,
  Terminal,
  terminal,
  terminalOf,
  TerminalFailure,
  PROBLEM_KINDS,
  type Problem,
  type ProblemKind,
} from './errors.js';
export { encodeResponse, decodeResponse, type IdemResponse, type StoredResponse } from './response.js';
export type { paths, components, operations } from './schema.js';
