// SPDX-License-Identifier: Apache-2.0

// The middleware's request identity against conformance/fingerprints.json,
// which the Go SDK's tests hold to the same bytes: the RFC 8785 canonical
// form of JSON bodies, the fingerprint, the credentials' digest and the
// scoped key.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { canonicalJson } from '../dist/jcs.js';
import { credentialDigest, credentialKey, fingerprint, legacyFingerprint, scopedKey } from '../dist/middleware.js';
import { vectors } from './vectors.mjs';

test('JSON texts canonicalize as RFC 8785 says, and what is not I-JSON does not', () => {
  for (const c of vectors.canonical) {
    assert.equal(canonicalJson(Buffer.from(c.json)), c.canonical ?? undefined, JSON.stringify(c.json).slice(0, 60));
  }
  for (const c of vectors.raw_canonical) {
    assert.equal(canonicalJson(Buffer.from(c.base64, 'base64')), c.canonical ?? undefined, c.base64);
  }
});

test("fingerprints are the Go middleware's", () => {
  for (const r of vectors.requests) {
    const headers = Object.fromEntries(Object.entries(r.headers).map(([name, value]) => [name.toLowerCase(), value]));
    const body = Buffer.from(r.body);
    const credentials = credentialDigest(headers, credentialKey(r.secret), r.credential_cookies);
    assert.equal(fingerprint(r.method, r.target, body, headers['content-type'], credentials), r.fingerprint, r.name);
    assert.equal(legacyFingerprint(r.method, r.target, body), r.legacy_fingerprint, r.name);
  }
});

test("scoped keys are the Go middleware's, within idemsvc's 255 bytes", () => {
  for (const k of vectors.scoped_keys) {
    const got = scopedKey(k.scope, k.key);
    assert.equal(got, k.stored_key, `${k.scope} ${k.key.slice(0, 20)}`);
    assert.ok(got.length <= 255);
  }
  assert.equal(scopedKey('alice', 'a b'), undefined, 'a key with a space');
});
