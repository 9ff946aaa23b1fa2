package replication

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection, the reading end
// wrapped as Connect wraps the replication socket.
func tcpPair(t *testing.T) (*lowWaterConn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	w := <-accepted
	if w == nil {
		t.Fatal("accept failed")
	}
	lc := newLowWaterConn(c).(*lowWaterConn)
	t.Cleanup(func() { lc.Close(); w.Close() })
	if runtime.GOOS == "linux" && lc.raw == nil {
		t.Fatal("SO_RCVLOWAT could not be set on a TCP socket")
	}
	return lc, w
}

// A fast stream switches to bulk reads; every byte still arrives, in order,
// and a row sent after the burst is not held back waiting for more.
func TestLowWaterConnBurstThenTrickle(t *testing.T) {
	r, w := tcpPair(t)
	const rowSize, rows = 150, 20000
	sent := make([]byte, 0, rowSize*rows)
	for i := range rows {
		for j := range rowSize {
			sent = append(sent, byte(i+j))
		}
	}
	go func() {
		// One write per row, as the walsender sends them.
		for row := range slices.Chunk(sent, rowSize) {
			if _, err := w.Write(row); err != nil {
				return
			}
		}
	}()
	got := make([]byte, 0, rowSize*rows)
	buf := make([]byte, 256<<10)
	sawBulk := false
	for len(got) < rowSize*rows {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatalf("read after %d bytes: %v", len(got), err)
		}
		got = append(got, buf[:n]...)
		sawBulk = sawBulk || r.bulk
	}
	if !bytes.Equal(got, sent) {
		t.Fatal("bytes read differ from bytes written")
	}
	if runtime.GOOS == "linux" && !sawBulk {
		t.Error("a 3 MB burst did not switch the reader to bulk mode")
	}

	// One short row after the burst: below the low-water mark, it must
	// still be delivered (after bulkWait at most, here within the
	// generous deadline).
	if _, err := w.Write([]byte("tail")); err != nil {
		t.Fatal(err)
	}
	r.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := r.Read(buf)
	if err != nil || string(buf[:n]) != "tail" {
		t.Fatalf("read after the burst = %q, %v; want \"tail\"", buf[:n], err)
	}
	r.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := r.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read of an idle stream: %v, want a deadline error", err)
	}
	if r.bulk {
		t.Error("still in bulk mode after the stream went idle")
	}
}

// The caller's deadline holds in bulk mode too, including one moved in
// from another goroutine while a read waits (how Receiver.Run is cancelled).
func TestLowWaterConnDeadlines(t *testing.T) {
	r, w := tcpPair(t)
	if err := r.setBulk(true); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1024)

	r.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := r.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want a deadline error", err)
	}

	r.SetReadDeadline(time.Time{})
	go func() {
		time.Sleep(20 * time.Millisecond)
		r.SetReadDeadline(time.Now())
	}()
	if _, err := r.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read woken by a deadline set elsewhere: %v, want a deadline error", err)
	}

	// The connection stays usable after a timeout.
	r.SetReadDeadline(time.Time{})
	w.Write([]byte("x"))
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "x" {
		t.Fatalf("read after a timeout = %q, %v", buf[:n], err)
	}

	w.Close()
	for {
		_, err := r.Read(buf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read of a closed connection: %v, want EOF", err)
		}
	}
}
