package main

// Publishes that reach NATS late: a killed owner's, held by a slow link
// while a standby takes over, and one tailer's own, held on a connection
// that was reset while it went on over a new one. Before session markers
// such a publish could land between two of the next session's pipelined
// messages (the first refused, the second accepted on top of it), and the
// restart resumed after the last message's position, skipping the refused
// message's tokens (issue 34: 3 of 3 runs lost 3 to 43 tokens).

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
)

// createR3 creates the stream as the tailer would, with three replicas,
// once the cluster can, and deletes it when the test ends.
func createR3(t *testing.T, c *cluster, name string) {
	t.Helper()
	conn, err := nats.Connect(c.natsURL())
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(conn)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		js.DeleteStream(ctx, name)
		conn.Close()
	})
	tailertest.Eventually(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
		defer cancel()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"mailroom.batches", "mailroom.batches.>"},
			Storage: jetstream.FileStorage, Replicas: 3, Duplicates: 2 * time.Minute}); err != nil {
			return fmt.Errorf("R3 stream: %w", err)
		}
		return nil
	})
}

// One tailer whose connection is reset while its publishes (tokens 1-7,
// then 8-10) are held on it: its session fails, it reconnects, and the next
// session reads the stream without them and publishes 1-10 and 11-13 at
// once, held too. The old connection delivers 1-7 first, then the new one
// its two, then the old one 8-10. Before session markers 1-7 landed, 1-10
// was refused, 11-13 accepted on top of 1-7, and the restart skipped 8-10
// (issue 34: 2 of 2 runs lost 3).
func TestLatePublishAfterConnectionReset(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	g := delayProxy(t, fmt.Sprintf("127.0.0.1:%d", c.natsPort), 0)
	a := c.tailer("MAILROOM_NATS_URL=nats://"+g.Addr, "MAILROOM_MAX_IN_FLIGHT=2", "MAILROOM_MAX_BATCHES_PER_MESSAGE=1")
	a.waitLog("msg=streaming", 1, 30*time.Second)
	openFirst := g.Close()
	c.accounts("first", 7)
	waitGated(t, g, 1)
	openSecond := g.Close()
	c.accounts("second", 3)
	waitGated(t, g, 2)
	openNext := g.Close()
	g.Reset()
	a.waitLog("msg=streaming", 2, 30*time.Second)
	waitGated(t, g, 3)
	c.accounts("next", 3)
	waitGated(t, g, 4)
	for _, open := range []func(){openFirst, openNext, openSecond} {
		before := g.replies.Load()
		open()
		tailertest.Eventually(t, 10*time.Second, func() error {
			if g.replies.Load() <= before {
				return errors.New("the publishes released not answered yet")
			}
			return nil
		})
	}
	if n := c.expectExactlyOnce(60 * time.Second); n != 13 {
		t.Fatalf("%d tokens", n)
	}
}

// lateSetup is a cluster for a late-publish ordering, on one NATS server or
// (three) on a three-node cluster, with the address the proxies forward to
// and the settings every tailer of it takes.
func lateSetup(t *testing.T, three bool) (*cluster, string, []string) {
	t.Helper()
	c := newCluster(t, pgtest.Shared(t), 10, 50*time.Millisecond)
	if !three {
		return c, fmt.Sprintf("127.0.0.1:%d", c.natsPort), nil
	}
	nats3 := newNATSCluster(t)
	c.stopNATS()
	c.natsURLs = nats3.urls()
	name := "ORDER"
	createR3(t, c, name)
	c.streamName = name
	return c, fmt.Sprintf("127.0.0.1:%d", nats3.client[0]), []string{"MAILROOM_NATS_STREAM=" + name, "MAILROOM_NATS_REPLICAS=3"}
}

// released opens p and waits until the server answered every publish it
// held.
func released(t *testing.T, p *slowProxy) {
	t.Helper()
	before, want := p.replies.Load(), p.gated.Load()
	p.Open()
	tailertest.Eventually(t, 10*time.Second, func() error {
		if p.released.Load() < want || p.replies.Load() < before+want {
			return fmt.Errorf("%d of %d held publishes delivered, %d answered", p.released.Load(), want, p.replies.Load()-before)
		}
		return nil
	})
}

// The two orderings a late publish can take, each forced by holding
// publishes at the proxies (acceptance of issue 34, item 1):
//
//   - The killed owner's batch (tokens 1-7) lands after the standby read the
//     stream and before the standby's first two messages (1-10, 11-13),
//     which were sent together. Before session markers the first was
//     refused and the second accepted on top of the owner's, and the restart
//     resumed after token 13: 8-10 were lost.
//   - The owner's second held message lands on top of the standby's first
//     (the first held one refused), covering tokens the standby's first
//     message covered too, cut otherwise: before session markers they were
//     on the stream twice.
func TestLatePublishOrderings(t *testing.T) {
	t.Parallel()
	latePublishOrderings(t, false)
}

// TestLatePublishOrderingsR3 is TestLatePublishOrderings on a three-node
// cluster, an R3 stream and every setting at its default.
func TestLatePublishOrderingsR3(t *testing.T) {
	t.Parallel()
	latePublishOrderings(t, true)
}

func latePublishOrderings(t *testing.T, three bool) {
	t.Run("refused message's successor accepted", func(t *testing.T) {
		t.Parallel()
		c, addr, env := lateSetup(t, three)
		ga, gb := delayProxy(t, addr, 0), delayProxy(t, addr, 0)
		pipelined := append([]string{"MAILROOM_MAX_IN_FLIGHT=2", "MAILROOM_MAX_BATCHES_PER_MESSAGE=1"}, env...)
		a := c.tailer(append([]string{"MAILROOM_NATS_URL=nats://" + ga.Addr}, pipelined...)...)
		a.waitLog("msg=streaming", 1, 60*time.Second)
		b := c.tailer(append([]string{"MAILROOM_NATS_URL=nats://" + gb.Addr}, pipelined...)...)
		b.waitLog("standing by", 1, 30*time.Second)
		ga.Close()
		c.accounts("owner", 7)
		waitGated(t, ga, 1)
		gb.Close()
		a.kill()
		c.accounts("standby", 6)
		b.waitLog("msg=streaming", 1, 30*time.Second)
		waitGated(t, gb, 2)
		released(t, ga)
		gb.Open()
		if n := c.expectExactlyOnce(60 * time.Second); n != 13 {
			t.Fatalf("%d tokens", n)
		}
	})
	t.Run("late message on top of the next session's first", func(t *testing.T) {
		t.Parallel()
		c, addr, env := lateSetup(t, three)
		ga := delayProxy(t, addr, 0)
		a := c.tailer(append([]string{"MAILROOM_NATS_URL=nats://" + ga.Addr, "MAILROOM_BATCH_LIMIT=3", "MAILROOM_MAX_IN_FLIGHT=2",
			"MAILROOM_MAX_BATCHES_PER_MESSAGE=1"}, env...)...)
		a.waitLog("msg=streaming", 1, 60*time.Second)
		b := c.tailer(append([]string{"MAILROOM_BATCH_LIMIT=5", "MAILROOM_BATCH_TIMEOUT=3000"}, env...)...)
		b.waitLog("standing by", 1, 30*time.Second)
		ga.Close()
		c.accounts("owner", 6)
		waitGated(t, ga, 2)
		a.kill()
		b.waitLog("msg=streaming", 1, 30*time.Second)
		tailertest.Eventually(t, 30*time.Second, func() error {
			if n := len(c.tokenCounts()); n < 5 {
				return fmt.Errorf("%d tokens on the stream, want the standby's first batch of 5", n)
			}
			return nil
		})
		released(t, ga)
		if n := c.expectExactlyOnce(60 * time.Second); n != 6 {
			t.Fatalf("%d tokens", n)
		}
	})
}

// waitGated waits until p holds n batch publishes.
func waitGated(t *testing.T, p *slowProxy, n int64) {
	t.Helper()
	tailertest.Eventually(t, 30*time.Second, func() error {
		if got := p.gated.Load(); got < n {
			return fmt.Errorf("%d batch publishes held, want %d", got, n)
		}
		return nil
	})
}
