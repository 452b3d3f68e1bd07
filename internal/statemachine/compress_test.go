// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/klauspost/compress/zstd"

	"github.com/idemsvc/idemsvc/internal/answer"
)

// bodies are the bodies the codec tests store: JSON answers around the
// threshold and far above it, incompressible ones, repeated text, and the
// empty and one-byte ones.
func bodies() map[string]string {
	m := map[string]string{"empty": "", "one byte": "x", "repeated 1 MiB-64": strings.Repeat("ab", (1<<20-64)/2)}
	for _, n := range []int{64, 1000, 1023, 1024, 1025, 1100, 2048, 4095, 16 << 10, 64<<10 + 1, 256 << 10, 256<<10 + 1, 1<<20 - 64} {
		m["json "+strconv.Itoa(n)] = answer.JSON(n, uint64(n))
	}
	for _, n := range []int{1023, 1024, 1025, 16 << 10, 1<<20 - 64} {
		m["random "+strconv.Itoa(n)] = answer.Incompressible(n, uint64(n))
	}
	return m
}

// TestResponseCodec: every body decodes byte for byte, whole and as a
// stream; a body is kept compressed exactly when it has 1 KiB or more and
// saves an eighth; what it counts against stored_bytes is the body as sent.
func TestResponseCodec(t *testing.T) {
	for name, body := range bodies() {
		for _, b64 := range []bool{false, true} {
			r := Response{StatusCode: 201, Headers: map[string]string{"Content-Type": "application/json", "X-Id": "7"}, Body: body, Base64: b64}
			form := EncodeResponse(&r, compressMinBytes)
			got, err := decodeResponse(form, 1<<20, false)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got.Body != body || got.StatusCode != 201 || got.Base64 != b64 || len(got.Headers) != 2 || got.Headers["X-Id"] != "7" {
				t.Fatalf("%s: decoded %d bytes (%v), want the %d sent", name, len(got.Body), got.Base64, len(body))
			}
			compressed := form[0]&encodingMask == encodingZstd
			headers := int64(len("Content-Type") + len("application/json") + len("X-Id") + len("7"))
			if n := StoredSize(form, &r); n != int64(len(body))+headers {
				t.Errorf("%s: counts %d stored bytes, want the body as sent and the headers, %d", name, n, int64(len(body))+headers)
			}
			stored := int64(len(form) - 7 - 8*len(r.Headers)) // what the record holds after its fixed fields
			if compressed {
				if len(body) < compressMinBytes || stored-headers > int64(len(body)-len(body)/compressMinGain) {
					t.Errorf("%s: kept compressed, %d of %d bytes", name, stored-headers, len(body))
				}
			} else if stored-headers != int64(len(body)) {
				t.Errorf("%s: stored %d bytes as sent, want %d", name, stored-headers, len(body))
			}
			streamed, err := decodeResponse(form, 1<<20, true)
			if err != nil {
				t.Fatalf("%s: streamed: %v", name, err)
			}
			if (streamed.Zstd != "") != (compressed && len(body) >= StreamBodiesFrom) {
				t.Errorf("%s: left compressed for a stream: %v", name, streamed.Zstd != "")
			}
			if got := readBody(t, &streamed); got != body || streamed.BodySize() != int64(len(body)) {
				t.Errorf("%s: streamed %d bytes (size %d), want the %d sent", name, len(got), streamed.BodySize(), len(body))
			}
			if compressed && len(body) > windowBytes {
				var h zstd.Header
				if err := h.Decode([]byte(form[len(form)-int(stored-headers):])); err != nil || h.WindowSize > windowBytes {
					t.Errorf("%s: a window of %d bytes (%v), want at most %d", name, h.WindowSize, err, windowBytes)
				}
			}
			switch {
			case strings.HasPrefix(name, "json") && len(body) >= 1024 && !compressed:
				t.Errorf("%s: a JSON answer over the threshold is kept as sent", name)
			case strings.HasPrefix(name, "random") && compressed:
				t.Errorf("%s: an incompressible body is kept compressed", name)
			case len(body) < 1024 && compressed:
				t.Errorf("%s: a body under the threshold is kept compressed", name)
			}
		}
	}
}

// readBody reads r's body through OpenBody.
func readBody(t *testing.T, r *Response) string {
	t.Helper()
	rc := r.OpenBody()
	defer rc.Close()
	b, err := io.ReadAll(iotest.OneByteReader(io.LimitReader(rc, 1<<30)))
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return string(b)
}

// TestCompressedOnce: a frame compressed by the caller (Compress, or a
// Compressor over a body written in pieces) is kept as it is, and decodes
// to the body.
func TestCompressedOnce(t *testing.T) {
	for _, n := range []int{2048, 64 << 10, 300 << 10, 1 << 20} {
		body := answer.JSON(n, uint64(n))
		frame, ok := Compress(body, compressMinBytes)
		if !ok {
			t.Fatalf("%d: not worth compressing", n)
		}
		c := NewCompressor(int64(n), len(frame)+1024)
		for rest := body; len(rest) > 0; {
			k := min(len(rest), 3000)
			if _, err := c.Write([]byte(rest[:k])); err != nil {
				t.Fatalf("%d: %v", n, err)
			}
			rest = rest[k:]
		}
		streamed, ok := c.Frame()
		if !ok {
			t.Fatalf("%d: the Compressor's frame is not kept", n)
		}
		for name, r := range map[string]Response{
			"beside the body": {Body: body, Zstd: frame, ZstdSize: int64(n)},
			"alone":           {Zstd: frame, ZstdSize: int64(n)},
			"streamed":        {Zstd: streamed, ZstdSize: int64(n)},
		} {
			form := EncodeResponse(&r, compressMinBytes)
			if form[0]&encodingMask != encodingZstd || StoredSize(form, &r) != int64(n) {
				t.Errorf("%d %s: flags %x, %d stored bytes", n, name, form[0], StoredSize(form, &r))
			}
			got, err := decodeResponse(form, 1<<20, false)
			if err != nil || got.Body != body {
				t.Errorf("%d %s: %v, %d bytes", n, name, err, len(got.Body))
			}
		}
	}
	// Past its limit, or for a body that does not compress, a Compressor
	// gives no frame.
	c := NewCompressor(64<<10, 1024)
	if _, err := c.Write([]byte(answer.JSON(64<<10, 1))); err == nil {
		if _, ok := c.Frame(); ok {
			t.Error("a frame past the limit is kept")
		}
	}
	c.Close()
	random := answer.Incompressible(64<<10, 2)
	c = NewCompressor(int64(len(random)), 1<<20)
	_, _ = c.Write([]byte(random))
	if _, ok := c.Frame(); ok {
		t.Error("a frame of random bytes is kept")
	}
}

// TestStreamedCorrupt: a long compressed body that is damaged, or whose
// frame declares another size than it holds, fails as it is read (a
// corrupt record), never reads as a whole body of other bytes.
func TestStreamedCorrupt(t *testing.T) {
	body := answer.JSON(256<<10, 9)
	frame, _ := Compress(body, compressMinBytes)
	flipped := []byte(frame)
	flipped[len(flipped)/2] ^= 0x55
	for name, r := range map[string]Response{
		"a flipped byte":   {Zstd: string(flipped), ZstdSize: int64(len(body))},
		"cut short":        {Zstd: frame[:len(frame)-100], ZstdSize: int64(len(body))},
		"a size too long":  {Zstd: frame, ZstdSize: int64(len(body)) + 1},
		"a size too short": {Zstd: frame, ZstdSize: int64(len(body)) - 1},
	} {
		rc := r.OpenBody()
		got, err := io.ReadAll(rc)
		rc.Close()
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: read %d bytes and %v, want a corrupt record", name, len(got), err)
		}
	}
}

// TestUncompressedFormDecodes: the form idemsvc wrote before it compressed
// bodies (flags 0 or 1, the body as sent, however long) still decodes.
func TestUncompressedFormDecodes(t *testing.T) {
	body := answer.JSON(16<<10, 3)
	for _, flags := range []byte{0, 1} {
		got, err := decodeResponse(oldForm(flags, 200, body), 1<<20, false)
		if err != nil || got.Body != body || got.Base64 != (flags == 1) || got.StatusCode != 200 || got.Headers["Content-Type"] != "application/json" {
			t.Errorf("flags %d: %v, body of %d bytes", flags, err, len(got.Body))
		}
	}
}

// oldForm is EncodeResponse's form as idemsvc wrote it before compression,
// with one Content-Type header.
func oldForm(flags byte, status uint16, body string) string {
	b := []byte{flags}
	b = binary.BigEndian.AppendUint16(b, status)
	b = binary.BigEndian.AppendUint32(b, 1)
	for _, s := range []string{"Content-Type", "application/json"} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return string(append(b, body...))
}

// TestCorruptCompressedBody: a compressed body that is damaged, cut short,
// of an unknown encoding, or that would decode past the limit (a
// decompression bomb) is a corrupt record: an error, never a panic, never
// a large allocation.
func TestCorruptCompressedBody(t *testing.T) {
	r := Response{StatusCode: 200, Body: answer.JSON(16<<10, 5)}
	form := EncodeResponse(&r, compressMinBytes)
	if form[0]&encodingMask != encodingZstd {
		t.Fatal("a 16 KiB JSON answer is not kept compressed")
	}
	const head = 7
	flipped := []byte(form)
	flipped[len(flipped)/2] ^= 0x55
	zeros := bytes.Repeat([]byte{0}, 64<<20)
	bomb := bodyEncoder.EncodeAll(zeros, []byte{encodingZstd, 0, 200, 0, 0, 0, 0})
	stream := func() string { // a frame that does not declare its size
		var buf bytes.Buffer
		w, _ := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
		w.Write(zeros[:2<<20])
		w.Close()
		return string([]byte{encodingZstd, 0, 200, 0, 0, 0, 0}) + buf.String()
	}()
	for name, s := range map[string]string{
		"a flipped byte":         string(flipped),
		"cut short":              form[:len(form)-10],
		"only the frame's start": form[:head+6],
		"no frame":               form[:head],
		"an unknown encoding":    string(append([]byte{3 << 1}, form[1:]...)),
		"64 MiB of zeros":        string(bomb),
		"a frame of no size":     stream,
		"a size that lies":       lyingSize(t, form[:head], form[head:]),
	} {
		got, err := decodeResponse(s, 1<<20, false)
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v and %d bytes, want a corrupt record", name, err, len(got.Body))
		}
	}
	for name, s := range map[string]string{"the bomb": string(bomb), "the frame of no size": stream} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _ = decodeResponse(s, 1<<20, false)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
			t.Errorf("decoding %s allocated %d bytes", name, n)
		}
	}
}

// lyingSize returns the response form whose frame declares 1 KiB of
// content but holds 16 KiB.
func lyingSize(t *testing.T, prefix, frame string) string {
	var h zstd.Header
	if err := h.Decode([]byte(frame)); err != nil || !h.HasFCS {
		t.Fatalf("header: %v", err)
	}
	b := []byte(frame)
	desc := b[4]
	at := 5
	if desc&0x20 == 0 { // not single segment: a window descriptor
		at++
	}
	at += []int{0, 1, 2, 4}[desc&3] // dictionary ID
	switch desc >> 6 {
	case 0: // single segment, 1 byte
		b[at] = 1 << 7
	case 1: // 2 bytes, plus 256
		binary.LittleEndian.PutUint16(b[at:], 1024-256)
	case 2:
		binary.LittleEndian.PutUint32(b[at:], 1024)
	default:
		binary.LittleEndian.PutUint64(b[at:], 1024)
	}
	if err := h.Decode(b); err != nil || h.FrameContentSize != 1024 && h.FrameContentSize != 128 {
		t.Fatalf("the lying header reads %d, %v", h.FrameContentSize, err)
	}
	return prefix + string(b)
}

// TestZstdOverhead: an incompressible body's frame fits zstdOverhead, so
// that EncodeResponse's one allocation holds it.
func TestZstdOverhead(t *testing.T) {
	for _, n := range []int{1024, 128 << 10, 128<<10 + 1, 1 << 20} {
		body := answer.Incompressible(n, uint64(n))
		if got := len(bodyEncoder.EncodeAll([]byte(body), nil)); got > n+zstdOverhead(n) {
			t.Errorf("%d random bytes: a frame of %d bytes, over the %d allowed", n, got, n+zstdOverhead(n))
		}
	}
}
