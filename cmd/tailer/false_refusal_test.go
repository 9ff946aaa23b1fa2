package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// holdLink forwards TCP connections to a server, and from the first
// client bytes that name subject on holds everything the client sends
// (what it received before is passed on; nothing after): the publish of
// that subject never reaches the server.
type holdLink struct {
	addr string
	held atomic.Bool
}

func newHoldLink(t *testing.T, target, subject string) *holdLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &holdLink{addr: ln.Addr().String()}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	pipe := func(dst, src net.Conn, watch bool) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if watch && bytes.Contains(buf[:n], []byte(subject)) {
				l.held.Store(true)
			}
			if n > 0 && !(watch && l.held.Load()) {
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				if err != io.EOF {
					dst.Close()
				}
				return
			}
		}
	}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			go pipe(server, client, true)
			go pipe(client, server, false)
		}
	}()
	return l
}

// A tailer killed before its first session's markers reached the stream
// (their publish held on the way) left a record naming the stream by its
// creation time and by no message; a stream that then reported another
// creation time (the replicas of an R3 stream each reported their own on
// older servers; a stream made again or restored, nothing of the
// tailer's on it) was refused as made again until a tailer resync, though
// nothing had been published to it (docs/faults.md, "What it cannot
// see": a false refusal). The stream is now named in the record with the
// markers, in one transaction: the next tailer streams, and every token
// is on the stream once. (On nats-server 2.15 a leader change keeps the
// creation time, the stream assignment's: measured with 27 step-downs.)
func TestNoFalseRefusalBeforeTheMarkers(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	link := newHoldLink(t, strings.TrimPrefix(c.natsURL(), "nats://"), "mailroom.batches._session")
	c.accounts("before", 5)
	p := c.tailer("MAILROOM_NATS_URL=nats://" + link.addr)
	tailertest.Eventually(t, 60*time.Second, func() error {
		if !link.held.Load() {
			return fmt.Errorf("no marker published yet:\n%s", p.out.String())
		}
		return nil
	})
	p.kill()
	var named *string
	if err := c.Conn.QueryRow(c.ctx, `SELECT stream_name FROM tailer_slot WHERE slot = 'mailroom'`).Scan(&named); err != nil {
		t.Fatal(err)
	}
	if named != nil {
		t.Fatalf("the record names stream %s before any marker of the incarnation is on it", *named)
	}

	// Another creation time, nothing of the tailer's lost.
	js := c.jsOf()
	s, err := js.Stream(c.ctx, "MAILROOM")
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if err := js.DeleteStream(c.ctx, "MAILROOM"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	c.makeStream(js, cfg)

	q := c.tailer()
	q.waitLog("msg=streaming", 1, 60*time.Second)
	c.accounts("after", 5)
	if n := c.expectExactlyOnce(60 * time.Second); n != 10 {
		t.Fatalf("%d tokens on the stream, want 10", n)
	}
	if strings.Contains(q.out.String(), "made again") {
		t.Fatalf("the stream was refused:\n%s", q.out.String())
	}
}
