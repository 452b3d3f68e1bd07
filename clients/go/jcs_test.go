// SPDX-License-Identifier: Apache-2.0

package idem

import (
	"encoding/binary"
	"encoding/hex"
	"math"
	"strings"
	"testing"
)

// RFC 8785, Appendix B: IEEE 754 values and their canonical form.
func TestCanonicalJSONNumbersOfRFC8785(t *testing.T) {
	for _, tc := range []struct{ bits, want string }{
		{"0000000000000000", "0"},
		{"8000000000000000", "0"}, // -0
		{"0000000000000001", "5e-324"},
		{"8000000000000001", "-5e-324"},
		{"7fefffffffffffff", "1.7976931348623157e+308"},
		{"ffefffffffffffff", "-1.7976931348623157e+308"},
		{"4340000000000000", "9007199254740992"},
		{"c340000000000000", "-9007199254740992"},
		{"4430000000000000", "295147905179352830000"},
		{"44b52d02c7e14af5", "9.999999999999997e+22"},
		{"44b52d02c7e14af6", "1e+23"},
		{"44b52d02c7e14af7", "1.0000000000000001e+23"},
		{"444b1ae4d6e2ef4e", "999999999999999700000"},
		{"444b1ae4d6e2ef4f", "999999999999999900000"},
		{"444b1ae4d6e2ef50", "1e+21"},
		{"3eb0c6f7a0b5ed8c", "9.999999999999997e-7"},
		{"3eb0c6f7a0b5ed8d", "0.000001"},
		{"41b3de4355555553", "333333333.3333332"},
		{"41b3de4355555554", "333333333.33333325"},
		{"41b3de4355555555", "333333333.3333333"},
		{"41b3de4355555556", "333333333.3333334"},
		{"41b3de4355555557", "333333333.33333343"},
		{"becbf647612f3696", "-0.0000033333333333333333"},
		{"43143ff3c1cb0959", "1424953923781206.2"},
	} {
		b, _ := hex.DecodeString(tc.bits)
		f := math.Float64frombits(binary.BigEndian.Uint64(b))
		if got := string(appendESNumber(nil, f)); got != tc.want {
			t.Errorf("%s (%v): %s, want %s", tc.bits, f, got, tc.want)
		}
		// The same value written as JSON reads back to the same form.
		if got, ok := canonicalJSON([]byte(tc.want)); !ok || string(got) != tc.want {
			t.Errorf("canonicalJSON(%s) = %s, %v", tc.want, got, ok)
		}
	}
}

func TestCanonicalJSON(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		// RFC 8785, 3.2.2: numbers, a string's escapes, literals (without
		// 333333333.33333329, more digits than a float64 keeps: refused).
		{`{
  "numbers": [333333333.3333333, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`, `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`},
		// RFC 8785, 3.2.3: member names sorted by UTF-16 code units.
		{`{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`, "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"},
		{`1e21`, `1e+21`},
		{`1E-7`, `1e-7`},
		{`-0`, `0`},
		{`-0.0e5`, `0`},
		{`12345678901234567000`, `12345678901234567000`},
		{`9007199254740992`, `9007199254740992`},
		{`9007199254740994`, `9007199254740994`}, // beyond 2^53, and a float64
		{`-9007199254740992.0e0`, `-9007199254740992`},
		{`0.30000000000000004`, `0.30000000000000004`},
		{`5e-324`, `5e-324`},
		{`0e999999999999999999999`, `0`},
		{`1.7976931348623157e308`, `1.7976931348623157e+308`},
		{`100`, `100`},
		{`100.00e-2`, `1`},
		{`0.00100`, `0.001`},
		{`0.1`, `0.1`},
		{` [ 1 , { } , [ ] , "" ] `, `[1,{},[],""]`},
		{`{"b":1,"a":{"d":[true],"c":null}}`, `{"a":{"c":null,"d":[true]},"b":1}`},
		{`[{"a":1},{"a":2}]`, `[{"a":1},{"a":2}]`},
		{`"\u001f\u007f\u2028\ud83d\ude00"`, "\"\\u001f\u007f\u2028😀\""},
		{`"\b\f\t\/"`, `"\b\f\t/"`},
		{`{"\ud83d\ude00":1,"\uffff":2,"\ue000":3}`, "{\"😀\":1,\"\ue000\":3,\"\uffff\":2}"},
		{strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth), strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth)},
	} {
		got, ok := canonicalJSON([]byte(tc.in))
		if !ok || string(got) != tc.want {
			t.Errorf("canonicalJSON(%.60q) = %q, %v; want %q", tc.in, got, ok, tc.want)
		}
	}
}

// What is not one I-JSON value is not canonicalized: the fingerprint then
// takes the raw bytes.
func TestCanonicalJSONRefuses(t *testing.T) {
	for _, in := range []string{
		``, ` `, `{`, `{"a":1,}`, `[1,]`, `01`, `1.`, `.5`, `-`, `1e`, `+1`, `tru`, `nul`, `NaN`, `Infinity`,
		`1e400`, `-1e309`, // beyond float64: JSON.parse would make them Infinity
		// Numbers a float64 does not hold as written: JCS would merge them
		// with another (9007199254740993 with 9007199254740992).
		`9007199254740993`, `-9007199254740993`, `12345678901234567890`, `333333333.33333329`,
		`0.10000000000000001`, `1e-400`, `-4e-324`, `1.7976931348623159e308`, `1e99999999999999999999`,
		`{"n":[1,2,9007199254740993]}`,
		// A member name that repeats (I-JSON requires unique names).
		`{"a":1,"a":2}`, `{"a":1,"a":1}`, `{"b":1,"a":2,"b":3}`, `{"x":{"a":1,"b":2,"a":3}}`, `{"\u0061":1,"a":2}`,
		`{"a":1} x`, `1 2`, `{a:1}`, `'a'`, `"a`, "\"\t\"", `"\x"`, `"\u12"`,
		`"\ud800"`, `"\udc00"`, `"\ud800\u0041"`, `"\ud800x"`, // lone surrogates
		"\"\xff\"", "\"\xed\xa0\x80\"", // invalid UTF-8, and a surrogate encoded in UTF-8
		"\xef\xbb\xbf{}", // a byte order mark
		strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1),
	} {
		if got, ok := canonicalJSON([]byte(in)); ok {
			t.Errorf("canonicalJSON(%.40q) = %q, want refused", in, got)
		}
	}
}

func BenchmarkCanonicalJSON(b *testing.B) {
	body := []byte(`{"amount":1000,"currency":"eur","customer":"cus_9s6XKzkNRiz8i3","description":"Order 42","metadata":{"order_id":"6735","shipping":"express"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := canonicalJSON(body); !ok {
			b.Fatal("refused")
		}
	}
}
