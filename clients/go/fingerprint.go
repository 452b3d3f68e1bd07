// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"hash"
	"net/http"
	"strings"
)

// The middleware's request identity: the fingerprint, the digest of the
// caller's credentials in it, and the key scoped to the end user. The
// TypeScript SDK (clients/ts/src/middleware.ts) computes the same bytes;
// conformance/fingerprints.json holds both to them.

// fingerprintPrefix marks the fingerprint's version: a record stored by an
// earlier version holds "sha256:…" (legacyFingerprint).
const fingerprintPrefix = "v2:sha256:"

// fingerprint is a SHA-256 of the method, NUL, the path, '?', the raw
// query, NUL, the hex digest of the caller's credentials (empty without
// one), NUL, and the body: the RFC 8785 canonical form of a JSON body
// (application/json, application/*+json) that is one I-JSON value JCS
// writes exactly (canonicalJSON), the raw bytes of any other.
func fingerprint(r *http.Request, body, credentials []byte) string {
	if isJSONMediaType(r.Header.Get("Content-Type")) {
		if canonical, ok := canonicalJSON(body); ok {
			body = canonical
		}
	}
	return digest(fingerprintPrefix, r, true, credentials, body)
}

// legacyFingerprint is the fingerprint of the SDK's versions before
// fingerprints had a version: a SHA-256 of the method, path, query and raw
// body. After a mismatch the middleware replays a record that holds it
// (legacyAnswer), so that records stored by those versions replay until
// they expire; it never begins with it.
func legacyFingerprint(r *http.Request, body []byte) string {
	return digest("sha256:", r, false, nil, body)
}

// digest is prefix and the hex SHA-256 of the method, NUL, the path, '?',
// the raw query, NUL, then, when withCredentials, the credentials in hex
// and NUL, and the body. (One function, so that the hash stays off the
// heap.)
func digest(prefix string, r *http.Request, withCredentials bool, credentials, body []byte) string {
	h := sha256.New()
	h.Write([]byte(r.Method))
	h.Write([]byte{0})
	h.Write([]byte(r.URL.Path))
	h.Write([]byte{'?'})
	h.Write([]byte(r.URL.RawQuery))
	h.Write([]byte{0})
	if withCredentials {
		var mac [2 * sha256.Size]byte
		h.Write(mac[:hex.Encode(mac[:], credentials)])
		h.Write([]byte{0})
	}
	h.Write(body)
	var sum [sha256.Size]byte
	out := make([]byte, len(prefix)+hex.EncodedLen(len(sum)))
	hex.Encode(out[copy(out, prefix):], h.Sum(sum[:0]))
	return string(out)
}

// isJSONMediaType reports whether a Content-Type names JSON:
// application/json or application/<anything>+json, in any case, with or
// without parameters.
func isJSONMediaType(contentType string) bool {
	mediaType, _, _ := strings.Cut(contentType, ";")
	mediaType = strings.ToLower(strings.Trim(mediaType, " \t"))
	sub, ok := strings.CutPrefix(mediaType, "application/")
	return ok && (sub == "json" || strings.HasSuffix(sub, "+json") && len(sub) > len("+json"))
}

// credentialKeyLabel derives the key of the credentials' digest from a
// secret (by default the client's API key), so that the digest is the same
// on every replica of a service and means nothing to idemsvc.
const credentialKeyLabel = "idemsvc middleware credentials"

// credentialKey is the key of the credentials' digest: HMAC-SHA256 of the
// label under the secret.
func credentialKey(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(credentialKeyLabel))
	return m.Sum(nil)
}

// credentialDigest is an HMAC-SHA256, under key, of the request's
// credentials: the Authorization header's (first) value, then, for each
// cookie name in cookies and each cookie of that name in the Cookie
// header(s) in order, NUL, name, '=' and value. It is nil for a request
// that carries none of them.
func credentialDigest(r *http.Request, key []byte, cookies []string) []byte {
	var m hash.Hash
	write := func(s string) {
		if m == nil {
			m = hmac.New(sha256.New, key)
		}
		m.Write([]byte(s))
	}
	if auth := r.Header.Get("Authorization"); auth != "" {
		write(auth)
	}
	if header := r.Header.Values("Cookie"); len(cookies) > 0 && len(header) > 0 {
		pairs := strings.Split(strings.Join(header, "; "), ";")
		for _, name := range cookies {
			for _, pair := range pairs {
				n, v, ok := strings.Cut(strings.Trim(pair, " \t"), "=")
				if ok && n == name {
					write("\x00" + n + "=" + v)
				}
			}
		}
	}
	if m == nil {
		return nil
	}
	return m.Sum(nil)
}

// scopedKey is the key stored for client key key of the end user scope:
// "~", the unpadded base64url SHA-256 of the scope, "~" and the key; or,
// when that would be over idemsvc's 255 bytes, "#" and the key's own
// digest in place of "~" and the key. The scope's digest has a fixed
// length, so two (scope, key) pairs never make one stored key; the key
// stays readable in idemctl's listings. It is false for a key with a byte
// idemsvc refuses (outside visible ASCII).
func scopedKey(scope, key string) (string, bool) {
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return "", false
		}
	}
	s := sha256.Sum256([]byte(scope))
	prefix := "~" + base64.RawURLEncoding.EncodeToString(s[:])
	if len(prefix)+1+len(key) <= maxKeyBytes {
		return prefix + "~" + key, true
	}
	k := sha256.Sum256([]byte(key))
	return prefix + "#" + base64.RawURLEncoding.EncodeToString(k[:]), true
}
