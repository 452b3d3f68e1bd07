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
 * I-JSON value (RFC 7493): a syntax error, invalid UTF-8, a lone
 * surrogate, a number beyond a double's range, or nesting deeper than
 * MAX_JSON_DEPTH. Of duplicate member names the last wins, as in JSON.parse.
 */
export function canonicalJson(body: Uint8Array): string | undefined {
  let value: unknown;
  try {
    value = JSON.parse(strictUtf8.decode(body));
  } catch {
    return undefined;
  }
  return serialize(value, 0);
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
