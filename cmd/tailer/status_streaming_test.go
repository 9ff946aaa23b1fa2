package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// tailer status fails when nothing streams (issue 46: it exited 0 with no
// tailer running and tokens waiting, and checked bytes only): no tailer
// ever, then one streaming (0), then none for longer than
// --max-unheld-seconds, or a lag in time past --max-lag-seconds (1); a
// missing slot names tailer resync; --json is JSON with PostgreSQL down.
func TestStatusFailsWhenNothingStreams(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	problems := func(rep statusReport) string { return strings.Join(rep.Problems, "; ") }
	if rep, code := c.status(1 << 40); code != exitFailure || !strings.Contains(problems(rep), "no tailer holds slot mailroom, and none has recorded streaming from it") {
		t.Fatalf("no tailer yet: exit %d, %+v", code, rep)
	}
	p := c.tailer("MAILROOM_LAG_INTERVAL=200")
	p.waitLog("msg=streaming", 1, 30*time.Second)
	c.accounts("a", 5)
	c.expectExactlyOnce(30 * time.Second)
	tailertest.Eventually(t, 30*time.Second, func() error {
		if rep, code := c.status(1 << 40); code != exitOK || rep.LagSeconds == nil {
			return &statusError{code, rep}
		}
		return nil
	})
	p.kill()
	time.Sleep(3 * time.Second)
	if rep, code := c.statusWith(1<<40, "MAILROOM_MAX_UNHELD_SECONDS=2"); code != exitFailure || !strings.Contains(problems(rep), "no tailer holds slot mailroom, and none has confirmed anything for") {
		t.Fatalf("no tailer for 3 s, --max-unheld-seconds 2: exit %d, %+v", code, rep)
	}
	if rep, code := c.statusWith(1<<40, "MAILROOM_MAX_LAG_SECONDS=1"); code != exitFailure || !strings.Contains(problems(rep), "more than MAILROOM_MAX_LAG_SECONDS 1") {
		t.Fatalf("3 s behind, --max-lag-seconds 1: exit %d, %+v", code, rep)
	}
	if rep, code := c.status(1 << 40); code != exitOK {
		t.Fatalf("3 s without a tailer, at the defaults: exit %d, %+v", code, rep)
	}
	c.Exec(`SELECT pg_drop_replication_slot('mailroom')`)
	if rep, code := c.status(1 << 40); code != exitFailure || !strings.Contains(problems(rep), "tailer resync") || rep.LagSeconds != nil {
		t.Fatalf("slot dropped: exit %d, %+v", code, rep)
	}
	cmd := exec.Command(tailerBin, "status", "--json")
	cmd.Env = append(os.Environ(), "MAILROOM_DATABASE_URL=postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	out, _ := cmd.Output()
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil || v["ok"] != false || v["error"] == "" || cmd.ProcessState.ExitCode() != exitFailure {
		t.Fatalf("status --json, PostgreSQL down: exit %d, %q (%v)", cmd.ProcessState.ExitCode(), out, err)
	}
}

type statusError struct {
	code int
	rep  statusReport
}

func (e *statusError) Error() string {
	b, _ := json.Marshal(e.rep)
	return fmt.Sprintf("tailer status exit %d: %s", e.code, b)
}
