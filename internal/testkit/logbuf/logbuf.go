// SPDX-License-Identifier: Apache-2.0

// Package logbuf holds a log's output that a server writes while a test
// reads it.
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer whose contents may be read while it is written
// to from other goroutines.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
