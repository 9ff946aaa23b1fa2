package tailertest

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// Buffer collects a tailer's output while the test reads it. With TB set,
// every write is also passed on to the test log.
type Buffer struct {
	TB testing.TB

	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	b.b.Write(p)
	b.mu.Unlock()
	if b.TB != nil {
		b.TB.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
