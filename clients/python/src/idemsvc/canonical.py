# SPDX-License-Identifier: Apache-2.0
"""JSON in its canonical form, RFC 8785 (JCS): members sorted by their
names' UTF-16 code units, no whitespace, strings escaped as ECMAScript's
JSON.stringify escapes them, numbers written as ECMAScript writes a double."""

from __future__ import annotations

import json
import math
from typing import Any

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(s: str, out: list[str]) -> None:
    out.append('"')
    for ch in s:
        e = _ESCAPES.get(ch)
        if e is not None:
            out.append(e)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')


def number(x: float) -> str:
    """x as ECMAScript's Number.prototype.toString writes it (RFC 8785 §3.2.2.3)."""
    if math.isnan(x) or math.isinf(x):
        raise ValueError("canonical JSON has no NaN or Infinity")
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    r = repr(abs(x))  # the shortest digits that round-trip, as ECMAScript picks them
    mantissa, _, exp = r.partition("e")
    whole, _, frac = mantissa.partition(".")
    if frac == "0":
        frac = ""
    digits = (whole + frac).lstrip("0")
    # value = 0.<digits> x 10^n
    n = len(whole) + (int(exp) if exp else 0)
    if whole == "0":
        stripped = frac.lstrip("0")
        n = -(len(frac) - len(stripped)) + (int(exp) if exp else 0)
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        body = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e > 0 else "-") + str(abs(e))
    return sign + body


def _double_holds(i: int) -> bool:
    """Whether JCS writes i exactly: its digits are the shortest ones of
    the double it reads as (as _number checks a JSON literal)."""
    if -(1 << 53) <= i <= 1 << 53:
        return True  # every such integer is a double, whose shortest digits are its own
    try:
        f = float(i)
    except OverflowError:
        return False
    return _significand(str(i)) == _significand(repr(abs(f)))


def _utf16(kv: tuple[Any, Any]) -> bytes:
    return str(kv[0]).encode("utf-16-be")


# Nesting beyond this is taken as raw bytes, as the Go and TypeScript SDKs take it.
MAX_DEPTH = 128


class NotIJSON(ValueError):
    """A JSON text that is not one I-JSON value (RFC 7493)."""


def _value(v: Any, out: list[str], depth: int = 0) -> None:
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, str):
        _string(v, out)
    elif isinstance(v, int) and not _double_holds(v):
        # A Python int (a payload's) that JCS's double would merge with
        # another (2**53 + 1 with 2**53): its exact digits, which no
        # double's canonical form spells, so the digest tells them apart.
        out.append(str(v))
    elif isinstance(v, (int, float)):
        f = float(v)
        if math.isinf(f) or math.isnan(f):
            raise NotIJSON("a number beyond a double")
        out.append(number(f))
    elif isinstance(v, dict):
        if depth >= MAX_DEPTH:
            raise NotIJSON("nested too deep")
        out.append("{")
        # Sorted by UTF-16 code units, as RFC 8785 §3.2.3 says.
        items = sorted(v.items(), key=_utf16)
        for i, (k, x) in enumerate(items):
            if i:
                out.append(",")
            _string(k, out)
            out.append(":")
            _value(x, out, depth + 1)
        out.append("}")
    elif isinstance(v, (list, tuple)):
        if depth >= MAX_DEPTH:
            raise NotIJSON("nested too deep")
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(",")
            _value(x, out, depth + 1)
        out.append("]")
    else:
        raise TypeError(f"canonical JSON cannot hold {type(v).__name__}")


def canonical_json(value: Any) -> bytes:
    """value (as json.loads gives it) in RFC 8785's canonical form, as UTF-8,
    except an int that a double does not hold as written (2**53 + 1), which
    is written exactly. A lone surrogate (which json.loads lets through from
    a \\ud800 escape) raises UnicodeEncodeError."""
    out: list[str] = []
    _value(value, out)
    return "".join(out).encode("utf-8")


def _no_constant(name: str) -> Any:
    raise NotIJSON(f"{name} is not JSON")


def _significand(lit: str) -> tuple[str, int]:
    """The number lit writes as digits × 10^exponent, the digits without
    leading or trailing zeros ("" for a zero)."""
    mantissa, _, exp = lit.lstrip("-").replace("E", "e").partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    if not digits:
        return "", 0  # a zero, whatever its exponent
    e = -len(frac) + (int(exp) if exp else 0)
    stripped = digits.rstrip("0")
    return stripped, e + len(digits) - len(stripped)


def _number(lit: str) -> float:
    """The double a JSON number reads as, when it is exactly the number the
    literal writes: its significant digits and exponent are the double's
    shortest ones, which JCS writes. Otherwise (an integer beyond 2^53 that
    a double rounds, more significant digits than a double keeps, a
    non-zero number that underflows to 0, one that overflows) NotIJSON: JCS
    would merge it with another number, as 9007199254740993 with
    9007199254740992. The Go SDK's exactNumber, digit for digit."""
    f = float(lit)  # from the literal, not int(): no limit on an integer's digits
    if math.isinf(f):
        raise NotIJSON("a number beyond a double")
    digits, exp = _significand(lit)
    if digits and (f == 0 or (digits, exp) != _significand(repr(abs(f)))):
        raise NotIJSON("a number a double does not hold exactly")
    return f


def _members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise NotIJSON("a member name repeats")  # I-JSON requires unique names
    return d


def canonicalize(body: bytes) -> bytes | None:
    """The canonical form of a JSON text, or None when it is not one I-JSON
    value that JCS writes exactly: a syntax error, invalid UTF-8, a lone
    surrogate, a member name repeated in an object, a number a double does
    not hold exactly as written (see _number), or nesting deeper than
    MAX_DEPTH. Such a body is fingerprinted as raw bytes, so that two
    requests that mean different things never share a fingerprint."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_no_constant, parse_float=_number,
                           parse_int=_number, object_pairs_hook=_members)
        return canonical_json(value)
    except (ValueError, UnicodeDecodeError, RecursionError, TypeError):
        return None
