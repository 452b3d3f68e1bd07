// SPDX-License-Identifier: Apache-2.0

// Retrying, shared by the client's calls (client.ts) and doOnce's begins
// (do.ts).

import { randomUUID } from 'node:crypto';

const MIN_BACKOFF_MS = 50;
const MAX_BACKOFF_MS = 2_000;

/** A full-jitter exponential delay for the attempt'th retry. */
export function backoff(attempt: number): number {
  const d = Math.min(MIN_BACKOFF_MS * 2 ** Math.min(attempt, 16), MAX_BACKOFF_MS);
  return d / 2 + Math.random() * (d / 2);
}

/** Resolves after ms, or rejects with signal's reason when it fires first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** A random owner for a begin, so that its retries get the lease it may already have been given. */
export function newOwner(): string {
  // randomUUID draws from a cache of entropy: cheaper per call than randomBytes.
  return `idem-ts-${randomUUID().replaceAll('-', '')}`;
}
