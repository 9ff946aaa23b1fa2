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
)

// A password holding any printable byte, unencoded, in each URL and in
// each password setting, through run, migrate, status, resync and
// subscribe (issue 46: with p@ss/w0rd the tailer printed database=w0rd@…
// and looked up "ss", a piece of the password, on a resolver off this
// machine). Every host is an IP address, so any name looked up is a piece
// of a password: the resolver of this process is one that records every
// query. Each command ends with exit 2 naming the problem, or reaches the
// host as meant (listeners that take the connection and close it); no
// piece of the password is in its output.
func TestHostilePasswordsEveryCommand(t *testing.T) {
	queries := recordLookups(t)
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
				j.result <- hostileRun(j.cmd, hostileEnv(j.pw, j.inURL, pg.addr, nc.addr, dir), pg, nc)
			}
		}()
	}
	var failures []string
	for c := byte(' '); c <= '~'; c++ {
		pw := "Ab" + string(c) + "Secr3tTail"
		for _, inURL := range []bool{true, false} {
			results := make([]chan string, len(commands))
			for i, cmd := range commands {
				results[i] = make(chan string, 1)
				jobs <- job{pw, inURL, cmd, results[i]}
			}
			for i, r := range results {
				if msg := <-r; msg != "" {
					failures = append(failures, fmt.Sprintf("%q (in the URL: %v) through %s: %s", c, inURL, strings.Join(commands[i], " "), msg))
				}
			}
		}
	}
	close(jobs)
	wg.Wait()
	if q := queries(); len(q) > 0 {
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
// piece of the password in the output, or neither exit 2 nor a
// connection to the host as meant.
func hostileRun(args []string, env map[string]string, pg, nc *closer) string {
	before := pg.n.Load() + nc.n.Load()
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	code := execute(ctx, args, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, &out, &out)
	cancel()
	for _, piece := range []string{"Secr3t", "cr3tTa", "3tTail"} {
		if strings.Contains(out.String(), piece) {
			return fmt.Sprintf("exit %d, the password shows: %s", code, out.String())
		}
	}
	if code != exitConfig && pg.n.Load()+nc.n.Load() == before {
		return fmt.Sprintf("exit %d and no connection to the host meant: %s", code, out.String())
	}
	return ""
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

// recordLookups makes this process's resolver one that answers every
// query "no such name" and records it, until the test ends.
func recordLookups(t *testing.T) func() []string {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		names []string
	)
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
			mu.Lock()
			names = append(names, questionName(buf[12:n]))
			mu.Unlock()
			reply := append([]byte(nil), buf[:n]...)
			reply[2] |= 0x80             // a response
			reply[3] = reply[3]&0xf0 | 3 // NXDOMAIN
			pc.WriteTo(reply, from)
		}
	}()
	r := net.DefaultResolver
	preferGo, dial := r.PreferGo, r.Dial
	r.PreferGo = true
	r.Dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}
	t.Cleanup(func() {
		r.PreferGo, r.Dial = preferGo, dial
		pc.Close()
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), names...)
	}
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
