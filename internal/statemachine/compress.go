// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"unsafe"

	// zstd from klauspost/compress (already in the module graph through
	// go-redis's and OpenTelemetry's dependencies): at its fastest level it
	// compresses JSON answers 4-5x, 3-6x faster than gzip -6. A codec is
	// not idemsvc's job.
	"github.com/klauspost/compress/zstd"
)

// A body of at least compressMinBytes (Limits.CompressBodiesFrom) is
// stored zstd-compressed when that saves at least 1/compressMinGain of it;
// otherwise (a shorter body, or one that does not compress, such as an
// image or ciphertext) it is stored as sent. The figures are measured:
// docs/capacity.md, "Choosing the threshold".
//
// A body of more than windowBytes is compressed with a window of that
// size, so that a replay can decode it as it writes it (OpenBody) with
// about 260 KB of decoder state, however long the body: 300 replays of a
// 1 MiB answer in flight at once stay far under the contract's 300 MB
// (TestBoundedMemory), where decoding each whole took them over it. On
// JSON answers the smaller window costs no ratio (64 KiB against the
// default: 204,307 against 204,795 bytes for 1 MiB).
const (
	compressMinBytes = 1024
	compressMinGain  = 8
	windowBytes      = 64 << 10
	// StreamBodiesFrom is the decoded size from which a replay that asks
	// for it (WithStreamedBodies) gets a compressed body as its frame
	// (Response.Zstd), to decode as it writes it, rather than whole.
	StreamBodiesFrom = windowBytes
	// maxStreamWindow bounds the window a streamed decode may need: the
	// frames of bodies of 1 to 256 KiB written before windowBytes was
	// chosen have windows as long as themselves.
	maxStreamWindow = 256 << 10
)

// The body's encoding in the record: bits 1-2 of EncodeResponse's flags
// byte. Records written before compression have 0 there (identity).
const (
	flagBase64       = 1 << 0
	encodingMask     = 3 << 1
	encodingIdentity = 0 << 1
	encodingZstd     = 1 << 1
	flagRef          = 1 << 3 // the body is a reference to the blob store (codec.go)
)

// errTooLarge: a compressed body that would decode past the stored-response
// limit. It is a corrupt record: idemsvc never writes one.
var errTooLarge = errors.New("statemachine: a compressed body decodes past the stored-response limit")

// Two encoders and one decoder serve every store. EncodeAll and DecodeAll
// take a state from a pool of GOMAXPROCS states (concurrency 0) and run on
// the caller's goroutine: neither starts goroutines, and a call waits only
// when every state is in use. The states are allocated once.
var (
	bodyEncoder   = newEncoder()
	windowEncoder = newEncoder(zstd.WithWindowSize(windowBytes)) // bodies over windowBytes
	// WithDecodeAllCapLimit bounds a DecodeAll by the capacity of its
	// destination, which decompressBody sizes by the frame's declared
	// content size after checking it against the limit: no record can
	// make a replay allocate more than the stored-response limit.
	bodyDecoder = mustDecoder(zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(0),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecodeAllCapLimit(true),
	))
	// streamDecoders decode bodies as they are written (OpenBody): one
	// each, synchronous (concurrency 1: no goroutine), with a window of
	// at most maxStreamWindow, reused.
	streamDecoders = sync.Pool{New: func() any {
		return mustDecoder(zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(maxStreamWindow),
			zstd.WithDecoderMaxMemory(maxStreamWindow),
		))
	}}
)

func newEncoder(opts ...zstd.EOption) *zstd.Encoder {
	return mustEncoder(zstd.NewWriter(nil, append([]zstd.EOption{
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(0),
		zstd.WithLowerEncoderMem(true),
		zstd.WithEncoderCRC(true), // a flipped bit in a record fails its replay, never replays wrong bytes
		zstd.WithZeroFrames(true),
	}, opts...)...))
}

func mustEncoder(e *zstd.Encoder, err error) *zstd.Encoder {
	if err != nil {
		panic(err) // only for invalid options
	}
	return e
}

func mustDecoder(d *zstd.Decoder, err error) *zstd.Decoder {
	if err != nil {
		panic(err) // only for invalid options
	}
	return d
}

// appendBody appends body to dst as a record stores it, and returns its
// encoding: zstd when body has at least from bytes and compresses well
// enough, otherwise identity.
func appendBody(dst []byte, body string, from int) ([]byte, byte) {
	if len(body) >= from {
		head := len(dst)
		out := compress(dst, bytesOf(body))
		if n := len(out) - head; worthIt(n, len(body)) {
			return out, encodingZstd
		}
		dst = out[:head]
	}
	return append(dst, body...), encodingIdentity
}

// compress appends body's zstd frame to dst.
func compress(dst, body []byte) []byte {
	if len(body) > windowBytes {
		return windowEncoder.EncodeAll(body, dst)
	}
	return bodyEncoder.EncodeAll(body, dst)
}

// worthIt reports whether a frame of n bytes is worth keeping for a body
// of size bytes: it saves at least an eighth.
func worthIt(n, size int) bool { return n <= size-size/compressMinGain }

// Compress returns body's frame as a record would keep it, and whether it
// would: a caller that must know the compressed size (to choose between
// the record and the blob store) compresses once and hands the frame on
// in Response.Zstd. ok is false for a body the record would keep as sent
// (shorter than from, or not compressing well enough).
func Compress(body string, from int) (frame string, ok bool) {
	if len(body) < from {
		return "", false
	}
	out := compress(nil, bytesOf(body))
	if !worthIt(len(out), len(body)) {
		return "", false
	}
	return unsafe.String(unsafe.SliceData(out), len(out)), true
}

// NewCompressor returns a writer that compresses what it is given into
// at most limit bytes of frame, for a body of size bytes (known in
// advance, declared in the frame), as a record would keep it.
func NewCompressor(size int64, limit int) *Compressor {
	c := &Compressor{size: size, out: limitedBuffer{limit: limit}}
	c.enc = encoders.Get().(*zstd.Encoder)
	c.enc.ResetContentSize(&c.out, size)
	return c
}

// Compressor compresses a body written to it in pieces (a streamed body,
// never held whole) into a frame of at most a limit.
type Compressor struct {
	enc  *zstd.Encoder
	out  limitedBuffer
	size int64
	err  error
}

// encoders are the streaming encoders of Compressors, reused:
// synchronous, with the window of a record's long bodies.
var encoders = sync.Pool{New: func() any {
	return newEncoderWith(zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(windowBytes))
}}

func newEncoderWith(opts ...zstd.EOption) *zstd.Encoder {
	return mustEncoder(zstd.NewWriter(nil, append([]zstd.EOption{
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithLowerEncoderMem(true),
		zstd.WithEncoderCRC(true),
		zstd.WithZeroFrames(true),
	}, opts...)...))
}

// errFrameTooLong: the frame passed the Compressor's limit.
var errFrameTooLong = errors.New("statemachine: the compressed body passes its limit")

// Write compresses p; past the limit it fails, and the Compressor is done.
func (c *Compressor) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.enc.Write(p)
	if err != nil {
		c.fail(err)
	}
	return n, c.err
}

// WriteString compresses s, as Write does, without copying it.
func (c *Compressor) WriteString(s string) (int, error) { return c.Write(bytesOf(s)) }

func (c *Compressor) fail(err error) {
	c.err = err
	c.release()
}

func (c *Compressor) release() {
	if c.enc != nil {
		c.enc.Reset(nil)
		encoders.Put(c.enc)
		c.enc = nil
	}
}

// Frame ends the frame and returns it, and whether it is worth keeping
// (within the limit and an eighth shorter than the body). The Compressor
// is done either way.
func (c *Compressor) Frame() (string, bool) {
	if c.err != nil {
		return "", false
	}
	err := c.enc.Close()
	c.release()
	if err != nil || !worthIt(len(c.out.b), int(c.size)) {
		c.err = errFrameTooLong
		return "", false
	}
	c.err = errFrameTooLong // done
	return unsafe.String(unsafe.SliceData(c.out.b), len(c.out.b)), true
}

// Close lets go of the Compressor's encoder, if Frame did not.
func (c *Compressor) Close() { c.release() }

// limitedBuffer is a buffer that refuses to grow past limit.
type limitedBuffer struct {
	b     []byte
	limit int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if len(l.b)+len(p) > l.limit {
		return 0, errFrameTooLong
	}
	l.b = append(l.b, p...)
	return len(p), nil
}

// zstdOverhead bounds what a zstd frame adds to n bytes it cannot shrink:
// a frame header (at most 18 bytes), a 3-byte header per block (the
// encoder cuts blocks of 64 KiB at most), and the 4-byte checksum.
func zstdOverhead(n int) int { return 18 + 3*(n>>16+1) + 4 }

// decompressBody decodes a zstd body of at most maxBytes bytes.
func decompressBody(compressed string, maxBytes int) (string, error) {
	in := bytesOf(compressed)
	var h zstd.Header
	if err := h.Decode(in); err != nil {
		return "", fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if !h.HasFCS || h.FrameContentSize > uint64(maxBytes) {
		return "", fmt.Errorf("%w: %w", ErrCorrupt, errTooLarge)
	}
	out, err := bodyDecoder.DecodeAll(in, make([]byte, 0, h.FrameContentSize))
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if uint64(len(out)) != h.FrameContentSize {
		return "", fmt.Errorf("%w: a compressed body of %d bytes, not the %d its frame declares", ErrCorrupt, len(out), h.FrameContentSize)
	}
	return unsafe.String(unsafe.SliceData(out), len(out)), nil
}

// frameSize checks a body's zstd frame and returns the size it declares,
// at most maxBytes.
func frameSize(frame string, maxBytes int) (int64, error) {
	var h zstd.Header
	if err := h.Decode(bytesOf(frame)); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if !h.HasFCS || h.FrameContentSize > uint64(maxBytes) {
		return 0, fmt.Errorf("%w: %w", ErrCorrupt, errTooLarge)
	}
	return int64(h.FrameContentSize), nil
}

// OpenBody returns a reader of the body of r, decoded as it is read when
// the record keeps it compressed (Zstd): through one decoder of bounded
// window, never whole. Its bytes are the ZstdSize the frame declares (a
// frame that decodes to more or fewer, or fails its checksum, is an
// ErrCorrupt error by the end); Close gives the decoder back.
func (r *Response) OpenBody() io.ReadCloser {
	if r.Zstd == "" || r.Body != "" {
		body := stringReader(r.Body)
		return io.NopCloser(&body)
	}
	d := streamDecoders.Get().(*zstd.Decoder)
	frame := stringReader(r.Zstd)
	if err := d.Reset(&frame); err != nil {
		streamDecoders.Put(d)
		return &bodyReader{err: fmt.Errorf("%w: %w", ErrCorrupt, err)}
	}
	return &bodyReader{d: d, left: r.ZstdSize}
}

// bodyReader reads a compressed body as it decodes, holding it to its
// declared size.
type bodyReader struct {
	d    *zstd.Decoder
	left int64
	err  error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1] // one more, to find a frame that runs long
	}
	n, err := b.d.Read(p)
	b.left -= int64(n)
	switch {
	case b.left < 0:
		b.err = fmt.Errorf("%w: a compressed body decodes past its declared size", ErrCorrupt)
		return 0, b.err
	case err == io.EOF && b.left > 0:
		b.err = fmt.Errorf("%w: a compressed body decodes short of its declared size", ErrCorrupt)
	case err != nil && err != io.EOF:
		b.err = fmt.Errorf("%w: %w", ErrCorrupt, err)
	default:
		b.err = err
	}
	return n, b.err
}

func (b *bodyReader) Close() error {
	if b.d != nil {
		_ = b.d.Reset(nil)
		streamDecoders.Put(b.d)
		b.d = nil
	}
	return nil
}

// stringReader reads a string without copying it.
type stringReader string

func (s *stringReader) Read(p []byte) (int, error) {
	if len(*s) == 0 {
		return 0, io.EOF
	}
	n := copy(p, *s)
	*s = (*s)[n:]
	return n, nil
}

// bytesOf returns the bytes of s without copying them, for the zstd calls
// that only read their input: a copy of every body would double the
// allocation of a complete and of a replay.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
