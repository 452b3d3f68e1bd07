// SPDX-License-Identifier: Apache-2.0

// The RFC 8785 JSON Canonicalization Scheme (JCS), for the middleware's
// fingerprint of a JSON body. It is written here rather than taken from the
// `canonicalize` package: JSON.parse and JSON.stringify already do the
// work (ECMAScript number formatting and string escaping are what JCS
// specifies), and what remains is the rule for bodies that are not I-JSON,
// which must match the Go SDK's (clients/go/jcs.go) byte for byte, where
// `canonicalize` would write Infinity as null and a lone surrogate as an
// escape. conformance/fingerprints.json holds both SDKs to the same bytes.

const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** The nesting canonicalJson follows; a deeper text is taken as raw bytes. */
export const MAX_JSON_DEPTH = 128;

/**
 * The JCS form of the JSON text in body, or undefined when body is not one
 * I-JSON value (RFC 7493) that JCS writes exactly: a syntax error, invalid
 * UTF-8, a lone surrogate, a member name repeated in an object, a number
 * that a double does not hold exactly as written (see exactNumber), or
 * nesting deeper than MAX_JSON_DEPTH. Such a body is taken as raw bytes, so
 * that two requests that mean different things (accounts 9007199254740993
 * and 9007199254740992) never share a fingerprint.
 */
export function canonicalJson(body: Uint8Array): string | undefined {
  let text: string;
  let value: unknown;
  try {
    text = strictUtf8.decode(body);
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  const canonical = serialize(value, 0);
  if (canonical === undefined) return undefined;
  // A text that is its own canonical form has no repeated name (the parse
  // would have dropped one) and only numbers written as their shortest
  // digits (exact): the scan below would find nothing. Most bodies sent by
  // programs are (JSON.stringify of sorted members, no whitespace).
  if (canonical === text) return canonical;
  return exactAndUnique(text) ? canonical : undefined;
}

/**
 * Whether the JSON text (which JSON.parse read) has only numbers that
 * exactNumber takes and no object with a member name twice: what
 * JSON.parse hides (it rounds numbers, and keeps the last of equal names).
 */
function exactAndUnique(text: string): boolean {
  const objects: (Set<string> | undefined)[] = []; // per open value: an object's names, or undefined for an array
  let name = false; // the next string is a member name
  for (let i = 0; i < text.length; ) {
    const c = text[i]!;
    if (c === '"') {
      let j = i + 1;
      while (text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
      j++;
      if (name) {
        const names = objects[objects.length - 1]!;
        const n = JSON.parse(text.slice(i, j)) as string;
        if (names.has(n)) return false;
        names.add(n);
        name = false;
      }
      i = j;
      continue;
    }
    if (c === '-' || (c >= '0' && c <= '9')) {
      let j = i + 1;
      while (j < text.length && '0123456789+-.eE'.includes(text[j]!)) j++;
      if (!exactNumber(text.slice(i, j))) return false;
      i = j;
      continue;
    }
    if (c === '{') {
      objects.push(new Set());
      name = true;
    } else if (c === '[') {
      objects.push(undefined);
    } else if (c === '}' || c === ']') {
      objects.pop();
      name = false;
    } else if (c === ',') {
      name = objects[objects.length - 1] !== undefined;
    }
    i++;
  }
  return true;
}

/**
 * Whether the double that the JSON number lit reads as is exactly the
 * number lit writes, so that JCS's form of it (its shortest digits) means
 * what lit means: lit's significant digits and exponent are the double's
 * shortest ones. False for an integer beyond 2^53 that a double rounds
 * (9007199254740993), more significant digits than a double keeps
 * (0.10000000000000001), a non-zero number that underflows to 0 (1e-400)
 * and one that overflows. A zero, in any spelling, is exact. The Go SDK's
 * exactNumber is the same rule.
 */
export function exactNumber(lit: string): boolean {
  const m = /^-?(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(lit);
  if (!m) return false;
  const written = (m[1]! + (m[2] ?? '')).replace(/^0+/, '');
  if (written === '') return true; // a zero
  const e = m[3] === undefined ? 0 : Number(m[3]);
  if (!Number.isSafeInteger(e)) return false; // no double is that number
  const digits = written.replace(/0+$/, '');
  const exp = e - (m[2]?.length ?? 0) + (written.length - digits.length);
  const value = Math.abs(Number(lit));
  if (value === 0 || !Number.isFinite(value)) return false; // underflow, overflow
  // toExponential() with no argument writes the shortest digits: d.ddde±x.
  const [mantissa, x] = value.toExponential().split('e') as [string, string];
  const shortest = mantissa.replace('.', '');
  return digits === shortest && exp === Number(x) - shortest.length + 1;
}

function serialize(value: unknown, depth: number): string | undefined {
  switch (typeof value) {
    case 'boolean':
      return value ? 'true' : 'false';
    case 'number':
      // Number::toString, as RFC 8785 requires; -0 is "0".
      return Number.isFinite(value) ? JSON.stringify(value) : undefined;
    case 'string':
      return wellFormed(value) ? JSON.stringify(value) : undefined;
  }
  if (value === null) return 'null';
  if (depth >= MAX_JSON_DEPTH) return undefined;
  const parts: string[] = [];
  if (Array.isArray(value)) {
    for (const item of value) {
      const s = serialize(item, depth + 1);
      if (s === undefined) return undefined;
      parts.push(s);
    }
    return `[${parts.join(',')}]`;
  }
  const object = value as Record<string, unknown>;
  // sort() with no comparator orders by UTF-16 code units, as JCS does.
  for (const name of Object.keys(object).sort()) {
    const s = serialize(object[name], depth + 1);
    if (s === undefined || !wellFormed(name)) return undefined;
    parts.push(`${JSON.stringify(name)}:${s}`);
  }
  return `{${parts.join(',')}}`;
}

/** Whether s has no lone surrogate: String.prototype.isWellFormed (ES2024, Node 20). */
function wellFormed(s: string): boolean {
  return (s as unknown as { isWellFormed(): boolean }).isWellFormed();
}
