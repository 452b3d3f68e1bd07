package main

import (
	"io"
	"sync"
	"time"
)

// logWriter batches log lines: one request's line is not worth a system
// call of its own. It writes out what it holds every interval, when it
// holds more than logBufferBytes, and on Close; a crash loses at most the
// last interval's lines.
type logWriter struct {
	out      io.Writer
	interval time.Duration

	mu   sync.Mutex
	buf  []byte
	err  error // the first write error; later lines are dropped
	stop chan struct{}
	done chan struct{}
}

const logBufferBytes = 64 << 10

func newLogWriter(out io.Writer, interval time.Duration) *logWriter {
	w := &logWriter{out: out, interval: interval, buf: make([]byte, 0, logBufferBytes),
		stop: make(chan struct{}), done: make(chan struct{})}
	go w.loop()
	return w
}

// Write takes one or more whole lines.
func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if len(w.buf) >= logBufferBytes {
		w.flushLocked()
	}
	return len(p), nil
}

func (w *logWriter) loop() {
	defer close(w.done)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			w.mu.Lock()
			w.flushLocked()
			w.mu.Unlock()
		case <-w.stop:
			return
		}
	}
}

func (w *logWriter) flushLocked() {
	if len(w.buf) == 0 {
		return
	}
	if w.err == nil {
		_, w.err = w.out.Write(w.buf)
	}
	w.buf = w.buf[:0]
}

// Close writes out what is buffered and stops the periodic writes.
func (w *logWriter) Close() error {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	w.flushLocked()
	return w.err
}
