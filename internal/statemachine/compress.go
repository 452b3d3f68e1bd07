// SPDX-License-Identifier: Apache-2.0

package statemachine

import (
	"errors"
	"fmt"
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
// A body over compressMaxBytes is kept as sent too: a replay decompresses
// into memory of its own, and a large body that compresses well would let
// a few bytes read from Redis become that much memory at once for each of
// many replays (300 readers of a 1 MiB answer, TestBoundedMemory), where
// the transfer of a body kept whole from Redis paces them.
const (
	compressMinBytes = 1024
	compressMaxBytes = 256 << 10
	compressMinGain  = 8
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

// One encoder and one decoder serve every store. EncodeAll and DecodeAll
// take a state from a pool of GOMAXPROCS states (concurrency 0) and run on
// the caller's goroutine: neither starts goroutines, and a call waits only
// when every state is in use. The states are allocated once.
var (
	bodyEncoder = mustEncoder(zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(0),
		zstd.WithLowerEncoderMem(true),
		zstd.WithEncoderCRC(true), // a flipped bit in a record fails its replay, never replays wrong bytes
		zstd.WithZeroFrames(true),
	))
	// WithDecodeAllCapLimit bounds a DecodeAll by the capacity of its
	// destination, which decompressBody sizes by the frame's declared
	// content size after checking it against the limit: no record can
	// make a replay allocate more than the stored-response limit.
	bodyDecoder = mustDecoder(zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(0),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecodeAllCapLimit(true),
	))
)

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
// encoding: zstd when body has from to compressMaxBytes bytes and
// compresses well enough, otherwise identity.
func appendBody(dst []byte, body string, from int) ([]byte, byte) {
	if len(body) >= from && len(body) <= compressMaxBytes {
		head := len(dst)
		out := bodyEncoder.EncodeAll(bytesOf(body), dst)
		if n := len(out) - head; n <= len(body)-len(body)/compressMinGain {
			return out, encodingZstd
		}
		dst = out[:head]
	}
	return append(dst, body...), encodingIdentity
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

// bytesOf returns the bytes of s without copying them, for the zstd calls
// that only read their input: a copy of every body would double the
// allocation of a complete and of a replay.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
