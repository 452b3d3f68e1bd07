// SPDX-License-Identifier: Apache-2.0

import type { components } from './schema.js';

/** A response as the API stores it: a text body, or a binary one in base64. */
export type StoredResponse = components['schemas']['StoredResponse'];

/**
 * What an operation produced, stored by idemsvc and replayed byte for byte
 * to every duplicate. Every part is optional. A string body is stored as
 * text and replayed as a string; a `Uint8Array` body is stored in base64
 * and replayed as a `Uint8Array` (a `Buffer`).
 */
export interface IdemResponse {
  statusCode?: number;
  headers?: Record<string, string>;
  body?: string | Uint8Array;
}

/** r as the API stores it. */
export function encodeResponse(r: IdemResponse): StoredResponse {
  const out: StoredResponse = {};
  if (r.statusCode !== undefined) out.status_code = r.statusCode;
  if (r.headers !== undefined) out.headers = r.headers;
  if (typeof r.body === 'string') {
    out.body = r.body;
  } else if (r.body !== undefined) {
    out.body = toBuffer(r.body).toString('base64');
    out.body_encoding = 'base64';
  }
  return out;
}

/** The stored response s with its body decoded. */
export function decodeResponse(s: StoredResponse | undefined): IdemResponse {
  const out: IdemResponse = {};
  if (s === undefined) return out;
  if (s.status_code !== undefined) out.statusCode = s.status_code;
  if (s.headers !== undefined) out.headers = s.headers;
  if (s.body !== undefined) out.body = s.body_encoding === 'base64' ? Buffer.from(s.body, 'base64') : s.body;
  return out;
}

/** b as a Buffer, sharing its memory. */
export function toBuffer(b: Uint8Array): Buffer {
  return Buffer.isBuffer(b) ? b : Buffer.from(b.buffer, b.byteOffset, b.byteLength);
}
