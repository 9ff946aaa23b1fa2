package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode"
)

// A password holding any printable byte, unencoded, in each URL and in
// each password setting, through run, migrate, status, resync and
// subscribe (issue 46: with p@ss/w0rd the tailer printed database=w0rd@…
// and looked up "ss", a piece of the password, on a resolver off this
// machine). Every host is an IP address, so any name looked up is a piece
// of a password: the resolver of this process is one that records every
// query (lookups). Each command ends with exit 2 naming the problem, or reaches the
// host as meant (listeners that take the connection and close it); no
// piece of the password is in its output.
func TestHostilePasswordsEveryCommand(t *testing.T) {
	before := lookups.count()
	commands := [][]string{{"run"}, {"migrate"}, {"status", "--json"}, {"resync"}, {"subscribe", "--durable", "d"}, {"subscribe", "--durable", "d", "--into", "inbox"}}
	type job struct {
		pw     string
		inURL  bool
		cmd    []string
		result chan string
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pg, nc := acceptAndClose(t), acceptAndClose(t)
			dir := t.TempDir()
			for j := range jobs {
				j.result <- hostileRun(j.cmd, hostileEnv(j.pw, j.inURL, pg.addr, nc.addr, dir), j.pw, pg, nc)
			}
		}()
	}
	var failures []string
	for c := byte(' '); c <= '~'; c++ {
		// The second shape is the p@ss/w0rd: with '@', the part
		// between it and the '/' is a host name to look up.
		for _, pw := range []string{"Ab" + string(c) + "Secr3tTail", "Zq" + string(c) + "xv9/Wk7j"} {
			for _, inURL := range []bool{true, false} {
				results := make([]chan string, len(commands))
				for i, cmd := range commands {
					results[i] = make(chan string, 1)
					jobs <- job{pw, inURL, cmd, results[i]}
				}
				for i, r := range results {
					if msg := <-r; msg != "" {
						failures = append(failures, fmt.Sprintf("%q (in the URL: %v) through %s: %s", pw, inURL, strings.Join(commands[i], " "), msg))
					}
				}
			}
		}
	}
	close(jobs)
	wg.Wait()
	if q := lookups.since(before); len(q) > 0 {
		t.Errorf("names looked up, each a piece of a password: %q", q)
	}
	for _, f := range failures {
		t.Error(f)
	}
}

// hostileEnv holds pw in every URL (percent-encoding left out), or in the
// password settings beside plain URLs.
func hostileEnv(pw string, inURL bool, pg, nc, dir string) map[string]string {
	env := map[string]string{"MAILROOM_SECRET_KEY": goodKey, "MAILROOM_DATA_DIR": dir, "MAILROOM_HTTP_ADDR": "",
		"MAILROOM_PUBACK_TIMEOUT": "500", "MAILROOM_NATS_USER": "tailer"}
	if inURL {
		env["MAILROOM_DATABASE_URL"] = "postgres://owner:" + pw + "@" + pg + "/mailroom"
		env["MAILROOM_INBOX_URL"] = "postgres://owner:" + pw + "@" + pg + "/inbox"
		env["MAILROOM_NATS_URL"] = "nats://tailer:" + pw + "@" + nc
		delete(env, "MAILROOM_NATS_USER")
	} else {
		env["MAILROOM_DATABASE_URL"] = "postgres://owner@" + pg + "/mailroom"
		env["MAILROOM_INBOX_URL"] = "postgres://owner@" + pg + "/inbox"
		env["MAILROOM_NATS_URL"] = "nats://" + nc
		env["MAILROOM_DATABASE_PASSWORD"], env["MAILROOM_INBOX_PASSWORD"], env["MAILROOM_NATS_PASSWORD"] = pw, pw, pw
	}
	return env
}

// hostileRun runs args for at most a second and says what went wrong: a
// piece of the password pw in the output, or neither exit 2 nor a
// connection to the host as meant.
func hostileRun(args []string, env map[string]string, pw string, pg, nc *closer) string {
	before := pg.n.Load() + nc.n.Load()
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	code := execute(ctx, args, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, &out, &out)
	cancel()
	for _, piece := range pieces(pw) {
		if strings.Contains(out.String(), piece) {
			return fmt.Sprintf("exit %d, a piece of the password (%q) shows: %s", code, piece, out.String())
		}
	}
	if code != exitConfig && pg.n.Load()+nc.n.Load() == before {
		return fmt.Sprintf("exit %d and no connection to the host meant: %s", code, out.String())
	}
	return ""
}

// pieces are pw's runs of three letters or digits or more: what no
// message may show.
func pieces(pw string) []string {
	var out []string
	for _, run := range strings.FieldsFunc(pw, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if len(run) >= 3 {
			out = append(out, run)
		}
	}
	return out
}

// closer takes each connection and closes it, counting them.
type closer struct {
	addr string
	n    atomic.Int64
}

func acceptAndClose(t *testing.T) *closer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c := &closer{addr: ln.Addr().String()}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.n.Add(1)
			conn.Close()
		}
	}()
	return c
}

// lookups records every name this test process looks up: TestMain makes
// its resolver one that answers every query "no such name" (before any
// test starts a goroutine that might resolve, so that nothing races with
// the change).
var lookups lookupRecorder

type lookupRecorder struct {
	mu    sync.Mutex
	names []string
}

// start points net.DefaultResolver at a recorder on loopback.
func (l *lookupRecorder) start() error {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			l.mu.Lock()
			l.names = append(l.names, questionName(buf[12:n]))
			l.mu.Unlock()
			reply := append([]byte(nil), buf[:n]...)
			reply[2] |= 0x80             // a response
			reply[3] = reply[3]&0xf0 | 3 // NXDOMAIN
			pc.WriteTo(reply, from)
		}
	}()
	net.DefaultResolver.PreferGo = true
	net.DefaultResolver.Dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}
	return nil
}

// since returns the names looked up after the first n.
func (l *lookupRecorder) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.names[n:]...)
}

func (l *lookupRecorder) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.names)
}

// questionName is the name a DNS query's question asks about.
func questionName(q []byte) string {
	var labels []string
	for len(q) > 0 && q[0] != 0 && int(q[0]) < len(q) {
		labels = append(labels, string(q[1:1+q[0]]))
		q = q[1+q[0]:]
	}
	return strings.Join(labels, ".")
}
