package publish

import (
	"context"
	"errors"
	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/relay"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

// groupOrigin is the database the group tests' positions belong to.
var groupOrigin = relay.Origin{SystemID: "7", Timeline: 1, Database: "mailroom"}

// testBatches returns n batches of per tokens each, one transaction per
// batch at increasing positions, token ids 1.. in order; with lanes, batch
// i goes to lane i%2 and holds tokens of that lane's action.
func testBatches(n, per int, lanes bool) []*batch.Batch {
	var out []*batch.Batch
	id := int64(0)
	var seq batch.Seqs
	for i := range n {
		b := &batch.Batch{}
		if lanes {
			b.Lane = i % 2
		}
		for j := range per {
			id++
			tok := decoder.Token{Pos: wal.Position{Commit: wal.LSN(0x10000 + 0x100*i), Index: uint32(j)}, ID: id, Action: action.Activation}
			if b.Lane == 1 {
				tok.Action, tok.Code, tok.CodeLen = action.PasswordRecovery, [5]byte{'1', '2', '3', '4', '5'}, 5
			}
			tok.Secret[0], tok.Secret[1] = byte(id), byte(id>>8)
			b.Tokens = append(b.Tokens, tok)
		}
		b.FirstSeq = seq[b.Lane] + 1
		seq[b.Lane] += uint64(per)
		b.LastSeq = seq[b.Lane]
		out = append(out, b)
	}
	return out
}

// groupRun is one pipeline session on the stream: a publisher resumed as
// the owner, the batches handed over all at once (in closed after them).
type groupRun struct {
	t         *testing.T
	nc        *nats.Conn
	dest      Destination
	inFlight  int
	maxBytes  int
	maxBatch  int
	onMessage func(n int) // called after the n-th PubAck (1-based)

	mu       sync.Mutex
	done     []*batch.Batch
	batches  []int
	messages int
	joined   int // tokens joined, over every query
}

func (g *groupRun) BatchPublished(*batch.Batch, int, time.Duration) {}
func (g *groupRun) BatchDone(*batch.Batch)                          {}
func (g *groupRun) TokensSkipped(join.Skip, int)                    {}
func (g *groupRun) Joined(tokens int, _ time.Duration) {
	g.mu.Lock()
	g.joined += tokens
	g.mu.Unlock()
}
func (g *groupRun) MessagePublished(batches, _ int, _ time.Duration) {
	g.mu.Lock()
	g.messages++
	n := g.messages
	g.batches = append(g.batches, batches)
	g.mu.Unlock()
	if g.onMessage != nil {
		g.onMessage(n)
	}
}

func (g *groupRun) run(ctx context.Context, batches []*batch.Batch) error {
	g.t.Helper()
	pub := g.publisher(ctx)
	defer pub.Close()
	signer, err := token.NewSigner("k", make([]byte, token.KeySize))
	if err != nil {
		g.t.Fatal(err)
	}
	p := &Pipeline{Publisher: pub, Joiner: publishAll{}, Encoder: NewEncoder(signer, wire.FormatLine), MaxInFlight: g.inFlight, MaxBytes: g.maxBytes, MaxBatches: g.maxBatch,
		Observer: g, Done: func(b *batch.Batch) {
			g.mu.Lock()
			g.done = append(g.done, b)
			g.mu.Unlock()
		}}
	in := make(chan *batch.Batch, len(batches))
	for _, b := range batches {
		in <- b
	}
	close(in)
	return p.Run(ctx, in)
}

func (g *groupRun) publisher(ctx context.Context) *Publisher {
	g.t.Helper()
	pub, err := NewPublisher(ctx, g.nc, g.dest)
	if err != nil {
		g.t.Fatal(err)
	}
	if err := pub.Resume(ctx, relay.Owner{Origin: groupOrigin, Incarnation: "i1"}); err != nil {
		g.t.Fatal(err)
	}
	return pub
}

// storedTokens reads every message of the stream, decodes it as a consumer
// does, checks its headers against its body, and returns the token ids per
// subject in stream order and the batch sizes of every message.
func storedTokens(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) (map[string][]int64, [][]int) {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string][]int64{}
	var sizes [][]int
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if wire.IsMarker(m.Header) {
			continue
		}
		b, err := subscriber.Decode(m.Header, m.Data)
		if err != nil {
			t.Fatalf("message %d does not decode: %v", seq, err)
		}
		if got := strings.Count(string(m.Data), "\n") + 1; got != len(b.Sizes) {
			t.Fatalf("message %d: %d lines for %d batches", seq, got, len(b.Sizes))
		}
		for _, tok := range b.Tokens {
			ids[m.Subject] = append(ids[m.Subject], tok.ID)
		}
		sizes = append(sizes, b.Sizes)
	}
	return ids, sizes
}

// wantIDs returns the token ids of batches per subject, in order.
func wantIDs(dest Destination, batches []*batch.Batch) map[string][]int64 {
	subjects := dest.LaneSubjects()
	want := map[string][]int64{}
	for _, b := range batches {
		for _, tok := range b.Tokens {
			want[subjects[b.Lane]] = append(want[subjects[b.Lane]], tok.ID)
		}
	}
	return want
}

func equalIDs(got, want map[string][]int64) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if !slices.Equal(got[k], v) {
			return false
		}
	}
	return true
}

// Batches ready together while a message awaits its PubAck go out in one
// message, a line each, per subject; every batch is done once, in order
// within its lane.
func TestGroupCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	dest := Destination{Name: "GROUP", Subject: "mailroom.batches", Origin: groupOrigin, PerAction: true}
	batches := testBatches(40, 3, true)
	g := &groupRun{t: t, nc: nc, dest: dest, inFlight: 1}
	if err := g.run(ctx, batches); err != nil {
		t.Fatal(err)
	}
	ids, sizes := storedTokens(t, ctx, js, "GROUP")
	if want := wantIDs(dest, batches); !equalIDs(ids, want) {
		t.Fatalf("stream holds %v, want %v", ids, want)
	}
	total := 0
	for _, s := range sizes {
		for _, n := range s {
			if n != 3 {
				t.Fatalf("a message holds batches of %v tokens, want 3 each", s)
			}
		}
		total += len(s)
	}
	if total != 40 || len(sizes) >= 40 || len(sizes) != g.messages {
		t.Fatalf("%d batches in %d messages (%d acknowledged), want 40 in fewer", total, len(sizes), g.messages)
	}
	if carried := slices.Max(g.batches); carried < 2 {
		t.Fatalf("no message carried more than one batch: %v", g.batches)
	}
	if len(g.done) != 40 {
		t.Fatalf("%d batches done, want 40", len(g.done))
	}
	if g.joined != 120 {
		t.Fatalf("the joins reported %d tokens, want each of the 120 once", g.joined)
	}
	var last [batch.MaxLanes]uint64
	for _, b := range g.done {
		if b.FirstSeq != last[b.Lane]+1 {
			t.Fatalf("lane %d: batch from %d done after %d", b.Lane, b.FirstSeq, last[b.Lane])
		}
		last[b.Lane] = b.LastSeq
	}
}

// MaxBatches bounds the batches a message carries; 1 gives every batch a
// message of its own.
func TestGroupMaxBatches(t *testing.T) {
	for _, limit := range []int{1, 3} {
		t.Run(strconv.Itoa(limit), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			nc, js := testJetStream(t)
			dest := Destination{Name: "MAXB", Subject: "mailroom.batches", Origin: groupOrigin}
			batches := testBatches(10, 2, false)
			g := &groupRun{t: t, nc: nc, dest: dest, inFlight: 1, maxBatch: limit}
			if err := g.run(ctx, batches); err != nil {
				t.Fatal(err)
			}
			ids, sizes := storedTokens(t, ctx, js, "MAXB")
			if want := wantIDs(dest, batches); !equalIDs(ids, want) {
				t.Fatalf("stream holds %v, want %v", ids, want)
			}
			most := 0
			for _, s := range sizes {
				most = max(most, len(s))
			}
			if most != limit {
				t.Fatalf("messages of at most %d batches with MaxBatches %d: %v", most, limit, sizes)
			}
		})
	}
}

// A batch that arrives while nothing is in flight goes out at once, alone:
// the pipeline does not wait for company.
func TestGroupAloneAtLowLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	dest := Destination{Name: "ALONE", Subject: "mailroom.batches", Origin: groupOrigin}
	pub, err := NewPublisher(ctx, nc, dest)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Resume(ctx, relay.Owner{Origin: groupOrigin, Incarnation: "i1"}); err != nil {
		t.Fatal(err)
	}
	signer, _ := token.NewSigner("k", make([]byte, token.KeySize))
	done := make(chan *batch.Batch, 1)
	p := &Pipeline{Publisher: pub, Joiner: publishAll{}, Encoder: NewEncoder(signer, wire.FormatLine), Done: func(b *batch.Batch) { done <- b }}
	in := make(chan *batch.Batch)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(ctx, in) }()
	batches := testBatches(5, 2, false)
	for _, b := range batches {
		// The next batch is only handed over once this one is done: had
		// the pipeline held it back for company, this would time out.
		in <- b
		select {
		case got := <-done:
			if got != b {
				t.Fatal("another batch done")
			}
		case err := <-errc:
			t.Fatalf("pipeline ended: %v", err)
		case <-ctx.Done():
			t.Fatal("a lone batch was not published")
		}
	}
	close(in)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	ids, sizes := storedTokens(t, ctx, js, "ALONE")
	if want := wantIDs(dest, batches); !equalIDs(ids, want) {
		t.Fatalf("stream holds %v, want %v", ids, want)
	}
	if len(sizes) != 5 {
		t.Fatalf("%d messages for 5 batches published one at a time", len(sizes))
	}
}

// A group that needs several messages and is refused half way (another
// writer, a standby that took over, extended the stream in between): the
// batches of the messages acknowledged before are done, the others are
// not, and the next session publishes exactly the tokens still missing.
func TestGroupRefusedHalfWay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	dest := Destination{Name: "HALF", Subject: "mailroom.batches", Origin: groupOrigin}
	batches := testBatches(8, 3, false)
	// Room for two batches of three tokens a message.
	const maxBytes = messageOverhead + 900
	g := &groupRun{t: t, nc: nc, dest: dest, inFlight: 1, maxBytes: maxBytes}
	rival := &groupRun{t: t, nc: nc, dest: dest, inFlight: 1}
	g.onMessage = func(n int) {
		if n == 1 {
			// The rival publishes batch 3, the first of the next message.
			if err := rival.run(ctx, batches[2:3]); err != nil {
				t.Error(err)
			}
		}
	}
	err := g.run(ctx, slices.Clone(batches))
	if !errors.Is(err, ErrStreamMoved) || !strings.Contains(err.Error(), "wrong last sequence") {
		t.Fatalf("Run = %v, want the second message refused for its last sequence (ErrStreamMoved)", err)
	}
	if len(g.done) != 2 || g.done[0] != batches[0] || g.done[1] != batches[1] {
		t.Fatalf("%d batches done, want the first message's two", len(g.done))
	}
	// The slot replays from what was confirmed; all of it, here.
	again := &groupRun{t: t, nc: nc, dest: dest, inFlight: 1, maxBytes: maxBytes}
	if err := again.run(ctx, batches); err != nil {
		t.Fatal(err)
	}
	ids, _ := storedTokens(t, ctx, js, "HALF")
	if want := wantIDs(dest, batches); !equalIDs(ids, want) {
		t.Fatalf("stream holds %v, want each token once: %v", ids, want)
	}
	if len(again.done) != 8 {
		t.Fatalf("%d batches done after the restart, want 8", len(again.done))
	}
}

// A message of a group that is already on the stream (the same batches,
// published by a standby that took over, under the same id) is refused, not
// taken for the group's own: the server checks the chain before the
// duplicate window. The group stops there, and the next session publishes
// exactly what is missing.
func TestGroupWithADuplicate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	dest := Destination{Name: "DUP", Subject: "mailroom.batches", Origin: groupOrigin}
	batches := testBatches(6, 3, false)
	const maxBytes = messageOverhead + 900
	g := &groupRun{t: t, nc: nc, dest: dest, inFlight: 1, maxBytes: maxBytes}
	rival := &groupRun{t: t, nc: nc, dest: dest, inFlight: 1, maxBytes: maxBytes}
	g.onMessage = func(n int) {
		if n == 1 {
			// The rival publishes batches 3 and 4 as one message: the
			// message the group sends next, id and all.
			if err := rival.run(ctx, batches[2:4]); err != nil {
				t.Error(err)
			}
		}
	}
	err := g.run(ctx, slices.Clone(batches))
	if err == nil || !strings.Contains(err.Error(), "wrong last sequence") || !strings.Contains(err.Error(), BatchID(batches[2].First(), batches[3].Last())) {
		t.Fatalf("Run = %v, want the message of batches 3 and 4 refused", err)
	}
	if len(g.done) != 2 || len(rival.done) != 2 {
		t.Fatalf("%d batches done, and %d by the rival; want 2 and 2", len(g.done), len(rival.done))
	}
	again := &groupRun{t: t, nc: nc, dest: dest, inFlight: 1, maxBytes: maxBytes}
	if err := again.run(ctx, batches); err != nil {
		t.Fatal(err)
	}
	ids, sizes := storedTokens(t, ctx, js, "DUP")
	if want := wantIDs(dest, batches); !equalIDs(ids, want) {
		t.Fatalf("stream holds %v, want each token once: %v", ids, want)
	}
	if len(sizes) != 3 || len(again.done) != 6 {
		t.Fatalf("%d messages, %d batches done after the restart; want 3 messages of two batches, all 6 done", len(sizes), len(again.done))
	}
}
