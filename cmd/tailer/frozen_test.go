package main

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// A frozen owner is cut off: once its lease is gone (the server ends a
// session that stops pinging after 20 s), the standby ends the walsender
// the frozen owner still holds the slot with, instead of waiting for
// wal_sender_timeout (a minute), and streams within 25 s; the owner, once
// it runs again, publishes nothing the standby did. Before, the standby
// took over only when the owner came back (a 30 s or 40 s freeze) or after
// 60 s (issue 34). The same when the owner's link to the database freezes
// rather than the owner.
func TestFrozenOwnerIsCutOff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		freeze time.Duration
		link   bool
	}{
		{"owner stopped for 30s", 30 * time.Second, false},
		{"owner stopped for 75s", 75 * time.Second, false},
		{"owner's database link frozen", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
			env := []string{}
			var link *freezeLink
			if tc.link {
				u, err := url.Parse(c.URL)
				if err != nil {
					t.Fatal(err)
				}
				link = newFreezeLink(t, u.Host)
				u.Host = link.addr
				env = append(env, "MAILROOM_DATABASE_URL="+u.String())
			}
			a := c.tailer(env...)
			a.waitLog("msg=streaming", 1, 30*time.Second)
			b := c.tailer()
			b.waitLog("standing by", 1, 30*time.Second)
			w := c.startWriter(3, 5*time.Millisecond)
			tailertest.Eventually(t, 20*time.Second, func() error {
				if n := c.streamMsgs(); n < 5 {
					return fmt.Errorf("%d batches on the stream", n)
				}
				return nil
			})
			frozen := time.Now()
			if tc.link {
				link.freeze()
			} else {
				a.freeze()
			}
			b.waitLog("msg=streaming", 1, 25*time.Second)
			took := time.Since(frozen)
			if !strings.Contains(b.out.String(), "took the slot over from a process that lost its lease") {
				t.Errorf("the standby does not say it cut the owner off:\n%s", b.out.String())
			}
			t.Logf("standby streaming %s after the owner froze", took.Round(100*time.Millisecond))
			if !tc.link {
				time.Sleep(time.Until(frozen.Add(tc.freeze)))
				a.thaw()
			}
			time.Sleep(2 * time.Second)
			w.halt()
			if w.err != nil {
				t.Fatal(w.err)
			}
			c.expectExactlyOnce(60 * time.Second)
		})
	}
}

// freezeLink forwards TCP connections to a server until freeze is called;
// from then on it keeps every connection open and passes nothing either
// way, as a link that went silent does.
type freezeLink struct {
	addr   string
	frozen atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newFreezeLink(t *testing.T, target string) *freezeLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &freezeLink{addr: ln.Addr().String()}
	t.Cleanup(func() {
		ln.Close()
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range l.conns {
			c.Close()
		}
	})
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			for l.frozen.Load() {
				time.Sleep(100 * time.Millisecond)
			}
			if n > 0 {
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
			l.mu.Lock()
			l.conns = append(l.conns, client, server)
			l.mu.Unlock()
			go pipe(server, client)
			go pipe(client, server)
		}
	}()
	return l
}

func (l *freezeLink) freeze() { l.frozen.Store(true) }

// thaw passes on what was held, and everything after.
func (l *freezeLink) thaw() { l.frozen.Store(false) }
