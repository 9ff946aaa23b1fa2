package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

var (
	natsServerOnce sync.Once
	natsServerBin  string
	natsServerErr  error
)

// natsServerBinary builds nats-server, at the version go.mod requires, as
// a binary of its own: a process can be frozen (SIGSTOP) with its
// connections open, as a node of a cluster can be.
func natsServerBinary(t *testing.T) string {
	t.Helper()
	natsServerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nats-server")
		if err != nil {
			natsServerErr = err
			return
		}
		natsServerBin = filepath.Join(dir, "nats-server")
		out, err := exec.Command("go", "build", "-o", natsServerBin, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsServerErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if natsServerErr != nil {
		t.Fatal(natsServerErr)
	}
	return natsServerBin
}

// leaderInfo reads the stream through the nodes but except (-1: all).
func leaderInfo(ctx context.Context, urls string) (*jetstream.StreamInfo, error) {
	conn, err := nats.Connect(urls, nats.Timeout(time.Second))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	js, _ := jetstream.New(conn)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "MAILROOM")
	if err != nil {
		return nil, err
	}
	return s.CachedInfo(), nil
}

// The R3 stream's leader, the node the tailer is connected to, frozen
// (SIGSTOP: its connections open and silent) for 20 s, or partitioned from
// the other two nodes for 60 s (its clients still connected to it, what
// its routes carried held; the tailer's sessions failed there with
// "JetStream system temporarily unavailable" for the whole minute), under
// a writer (issue 49: the tailer published nothing for 25-30 s, ready all
// along, until a fixed 30 s PubAck wait ran out, and a client on the
// frozen node waited on its two-minute pings). /readyz and
// tailer_puback_wait_seconds say the wait within 5 s; the tailer streams
// again within 10 s of the new leader's election; every token once.
func TestFrozenStreamLeader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		hold  time.Duration
		fault func(fn *faultNodes, n int, on bool)
	}{
		{"frozen", 20 * time.Second, func(fn *faultNodes, n int, on bool) {
			fn.procs[n].Process.Signal(map[bool]syscall.Signal{true: syscall.SIGSTOP, false: syscall.SIGCONT}[on])
		}},
		{"partitioned", 60 * time.Second, func(fn *faultNodes, n int, on bool) { fn.partition(n, on) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			leaderFault(t, tc.hold, tc.fault)
		})
	}
}

func leaderFault(t *testing.T, hold time.Duration, fault func(fn *faultNodes, n int, on bool)) {
	fn := startFaultNodes(t)
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	c.stopNATS()
	c.natsURLs = fn.urls()
	tailertest.Eventually(t, 60*time.Second, func() error {
		conn, err := nats.Connect(c.natsURL())
		if err != nil {
			return err
		}
		defer conn.Close()
		js, _ := jetstream.New(conn)
		ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
		defer cancel()
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "MAILROOM", Subjects: []string{"mailroom.batches", "mailroom.batches.>"}, Storage: jetstream.FileStorage, Replicas: 3})
		return err
	})
	info, err := leaderInfo(c.ctx, c.natsURL())
	if err != nil || info.Cluster == nil || len(info.Cluster.Leader) != 2 {
		t.Fatalf("stream info: %v", err)
	}
	l := int(info.Cluster.Leader[1] - '1')
	// The tailer connected to the leader's node (it learns the others from
	// it): the worst case, where its own server goes silent or cut off.
	onLeader := "MAILROOM_NATS_URL=nats://127.0.0.1:" + strconv.Itoa(fn.client[l])
	p := c.watchedTailer("MAILROOM_NATS_REPLICAS=3", onLeader)
	p.waitLog("msg=streaming", 1, 30*time.Second)
	// A pinned subscriber on the same node: it must leave it too.
	out := filepath.Join(t.TempDir(), "lines")
	if err := os.WriteFile(out, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sub := c.command([]string{"subscribe", "--durable", "d", "--from-start", "--pinned-ttl", "2s", "--exec", "cat >> " + out}, onLeader)
	w := c.startWriter(3, 20*time.Millisecond)
	waitOutput(t, out, 1)
	time.Sleep(2 * time.Second)
	if info, err = leaderInfo(c.ctx, c.natsURL()); err != nil || info.Cluster == nil || info.Cluster.Leader != fmt.Sprintf("n%d", l+1) {
		t.Fatalf("the stream's leader moved before the fault: %v %v", info, err)
	}
	fault(fn, l, true)
	frozen := time.Now()
	var said, metric, elected, streaming, delivering time.Duration
	before, tokensBefore := uint64(0), 0
	for time.Since(frozen) < hold {
		now := time.Since(frozen)
		if got, _ := outputTokens(t, out); elected != 0 && tokensBefore == 0 {
			tokensBefore = len(got)
		} else if elected != 0 && delivering == 0 && len(got) > tokensBefore+2 {
			delivering = now
		}
		if said == 0 {
			if _, body := httpGet(p.base + "/readyz"); strings.Contains(body, "awaited its PubAck") {
				said = now
			}
		}
		if metric == 0 {
			_, page := httpGet(p.base + "/metrics")
			if v, ok := metricValue(page, "tailer_puback_wait_seconds"); ok && v >= 1 {
				metric = now
			}
		}
		if info, err := leaderInfo(c.ctx, fn.urlsExcept(l)); err == nil && info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != fmt.Sprintf("n%d", l+1) {
			switch {
			case elected == 0:
				elected, before = now, info.State.LastSeq
			case streaming == 0 && info.State.LastSeq > before+2:
				streaming = now
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	fault(fn, l, false)
	w.halt()
	if w.err != nil {
		t.Fatal(w.err)
	}
	n := c.expectExactlyOnce(90 * time.Second)
	awaitOutput(t, out, c.signedTokens())
	t.Logf("%d tokens; leader n%d out for %s: PubAck wait said on /readyz at %s, in the metric at %s; new leader at %s; streaming again at %s; the subscriber delivering again at %s",
		n, l+1, hold, said.Round(100*time.Millisecond), metric.Round(100*time.Millisecond), elected.Round(100*time.Millisecond), streaming.Round(100*time.Millisecond),
		delivering.Round(100*time.Millisecond))
	if moved := grepLines(sub.out.String(), "twice in a row"); moved != "" {
		t.Logf("the subscriber moved:\n%s", moved)
	}
	switch {
	case said == 0 || said > 5*time.Second || metric == 0 || metric > 5*time.Second:
		t.Fatalf("the PubAck wait was said at %s on /readyz and %s in the metric, want within 5 s:\n%s", said, metric, tail(p.out.String(), 30))
	case elected == 0:
		t.Fatalf("no new leader was elected within %s", hold)
	case streaming == 0 || streaming-elected > 10*time.Second:
		t.Fatalf("streaming again %s after the new leader's election, want within 10 s:\n%s", streaming-elected, tail(p.out.String(), 30))
	case delivering == 0:
		// Cut off on its node, it would wait for the partition to heal.
		t.Fatalf("the subscriber on n%d delivered nothing after the new leader's election while the fault lasted:\n%s", l+1, tail(sub.out.String(), 30))
	}
}
