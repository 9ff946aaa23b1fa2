package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"

	"github.com/mailroom/tailer/internal/testutil/natstest"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
)

// The embedded server's store on a filesystem that fills up under a
// writer, then is grown (issue 62: nothing named the cause, and after the
// disk was grown nothing was published until tailer run was restarted):
// the cause named within 10 s on /readyz, tailer_blocked, tailer status
// (exit 1) and in one ERROR; streaming again within 10 s of the room
// coming back, with no restart; every token once.
func TestEmbeddedStoreFillsAndGrows(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A filesystem of its own, to fill: tmpfs, as root.
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tailer-test", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs to fill (as root, with mount(8)): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	c := newCluster(t, pgtest.Shared(t), 10, 20*time.Millisecond)
	c.stopNATS()
	port, _ := pgtest.FreePort()
	c.natsURLs = fmt.Sprintf("nats://127.0.0.1:%d", port)
	store := filepath.Join(dir, "store")
	p := c.watchedTailer("MAILROOM_NATS_URL=", "MAILROOM_DATA_DIR="+store, fmt.Sprintf("MAILROOM_NATS_LISTEN=127.0.0.1:%d", port))
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("before", 10)
	c.expectExactlyOnce(30 * time.Second)
	// Most of what is left taken by a file of the operator's.
	fillAllBut(t, filepath.Join(dir, "filler"), 256<<10)
	w := c.startWriter(20, 5*time.Millisecond)
	filled := time.Now()
	p.blocked(c, "nats", "out of disk space")
	t.Logf("the full store was said %s after the writer started", time.Since(filled).Round(100*time.Millisecond))
	if out, err := exec.Command("mount", "-o", "remount,size=64m", dir).CombinedOutput(); err != nil {
		t.Fatalf("grow the filesystem: %v: %s", err, out)
	}
	grown := time.Now()
	p.ready(c)
	if took := time.Since(grown); took > 10*time.Second {
		t.Errorf("streaming again %s after the filesystem was grown, want within 10 s", took)
	}
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	c.accounts("after", 10)
	c.expectExactlyOnce(60 * time.Second)
	if n := strings.Count(p.out.String(), "level=ERROR msg=\"NATS stores no batches"); n != 1 {
		t.Errorf("the cause said %d times, want once:\n%s", n, p.out.String())
	}
}

// The tailer's NATS user denied publishing to its subject, then allowed
// again (issue 62: only "nats: timeout waiting for ack", the permission
// never named, tailer status exit 0): named within 10 s everywhere, and
// streaming within 10 s of the permission coming back; every token once.
func TestPublishDeniedAndAllowed(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 20*time.Millisecond)
	c.stopNATS()
	port, _ := pgtest.FreePort()
	users := func(deny ...string) []*server.User {
		return []*server.User{
			{Username: "admin", Password: "admin-pw"},
			{Username: "tailer", Password: "tailer-pw", Permissions: &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny}}},
		}
	}
	opts := &server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: t.TempDir(), Users: users()}
	srv := natstest.Server(t, opts)
	reload := func(deny ...string) {
		t.Helper()
		o := opts.Clone()
		o.Users = users(deny...)
		if err := srv.ReloadOptions(o); err != nil {
			t.Fatal(err)
		}
	}
	c.natsURLs = srv.ClientURL()
	c.natsOpts = []nats.Option{nats.UserInfo("admin", "admin-pw")}
	p := c.watchedTailer("MAILROOM_NATS_USER=tailer", "MAILROOM_NATS_PASSWORD=tailer-pw")
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("before", 10)
	c.expectExactlyOnce(30 * time.Second)

	reload("mailroom.batches", "mailroom.batches.>")
	w := c.startWriter(2, 20*time.Millisecond)
	denied := time.Now()
	p.blocked(c, "nats", "denies the tailer's NATS user tailer publishing")
	if took := time.Since(denied); took > 10*time.Second {
		t.Errorf("the denial said %s after it began, want within 10 s", took)
	}
	reload()
	allowed := time.Now()
	p.ready(c)
	if took := time.Since(allowed); took > 10*time.Second {
		t.Errorf("streaming again %s after the permission came back, want within 10 s", took)
	}
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	c.accounts("after", 10)
	c.expectExactlyOnce(60 * time.Second)
	if n := strings.Count(p.out.String(), "level=ERROR msg=\"NATS stores no batches"); n != 1 {
		t.Errorf("the cause said %d times, want once:\n%s", n, p.out.String())
	}
	if strings.Contains(p.out.String(), "tailer-pw") {
		t.Error("the password reached the log")
	}
}

// fillAllBut writes a file at path that leaves keep bytes free on its
// filesystem.
func fillAllBut(t *testing.T, path string, keep int64) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for left := int64(st.Bavail)*st.Bsize - keep; left > 0; left -= int64(len(chunk)) {
		if _, err := f.Write(chunk[:min(int64(len(chunk)), left)]); err != nil {
			t.Fatal(err)
		}
	}
}
