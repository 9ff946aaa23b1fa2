package publish

import (
	"context"
	"github.com/mailroom/tailer/decoder/wal"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/embedded"
)

func TestSubjectMatches(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"mailroom.batches", "mailroom.batches", true},
		{"mailroom.>", "mailroom.batches", true},
		{"mailroom.>", "mailroom.batches.activation", true},
		{"mailroom.>", "mailroom", false},
		{"mailroom.*", "mailroom.batches", true},
		{"mailroom.*", "mailroom.batches.activation", false},
		{"*.batches", "mailroom.batches", true},
		{">", "mailroom.batches", true},
		{"mailroom.batches", "mailroom.batches.activation", false},
		{"mailroom.batches.>", "mailroom.batches", false},
		{"mailroom.batches.*", "mailroom.batches.password_recovery", true},
		{"other.>", "mailroom.batches", false},
	} {
		if got := SubjectMatches(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("SubjectMatches(%q, %q) = %v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
}

func testJetStream(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv, err := embedded.Start(t.TempDir(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func testMessage(commit uint64) *Message {
	pos := wal.Position{Commit: wal.LSN(0x1000 + commit)}
	return &Message{First: pos, Last: pos, Count: 1, TokenIDs: "1", TokenKeys: "k" + strconv.FormatUint(commit, 10), Body: []byte("x")}
}

func TestStreamSubjectsByWildcard(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WILD", Subjects: []string{"mailroom.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, perAction := range []bool{false, true} {
		p, err := NewPublisher(ctx, nc, Destination{Name: "WILD", Subject: "mailroom.batches", PerAction: perAction})
		if err != nil {
			t.Fatalf("stream of mailroom.> refused for mailroom.batches (per action %v): %v", perAction, err)
		}
		p.Close()
	}
	_, err := NewPublisher(ctx, nc, Destination{Name: "WILD", Subject: "other.batches"})
	if err == nil || !strings.Contains(err.Error(), "does not take subject other.batches") {
		t.Fatalf("foreign subject: %v", err)
	}
}

// Two tailers that both start on an empty stream (a standby taking over
// before the first batch landed) cannot both publish: the first publish
// expects the stream's last sequence.
func TestFirstPublishIsChained(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, _ := testJetStream(t)
	cfg := Destination{Name: "CHAIN", Subject: "mailroom.batches"}
	a, err := NewPublisher(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewPublisher(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	fa, err := a.PublishAsync(testMessage(1))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-fa.Ok():
	case err := <-fa.Err():
		t.Fatalf("first tailer: %v", err)
	}
	fb, err := b.PublishAsync(testMessage(2))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ack := <-fb.Ok():
		t.Fatalf("second tailer's first publish onto a stream it saw empty was accepted (seq %d)", ack.Sequence)
	case err := <-fb.Err():
		if !strings.Contains(err.Error(), "wrong last sequence") {
			t.Fatalf("second tailer: %v, want wrong last sequence", err)
		}
	}
}

func TestCheckDuplicate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, _ := testJetStream(t)
	p, err := NewPublisher(ctx, nc, Destination{Name: "DUP", Subject: "mailroom.batches"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var ids []string
	for i := uint64(1); i <= 2; i++ {
		m := testMessage(i)
		f, err := p.PublishAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		<-f.Ok()
		ids = append(ids, BatchID(m.First, m.Last))
	}
	if err := p.CheckDuplicate(ctx, ids[0], "k1", 1); err != nil {
		t.Errorf("duplicate naming the batch's own message: %v", err)
	}
	for _, tc := range []struct {
		seq  uint64
		keys string
		want string
	}{{0, "k1", "without a stream sequence"}, {2, "k1", "which holds"}, {9, "k1", ErrDuplicateGone.Error()}, {1, "k9", ErrReusedID.Error()}} {
		if err := p.CheckDuplicate(ctx, ids[0], tc.keys, tc.seq); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("duplicate naming sequence %d with keys %s: %v, want %q", tc.seq, tc.keys, err, tc.want)
		}
	}
}

// Configurations that can remove the stream's last message are refused,
// naming the setting; limits that discard old messages are not.
func TestStreamConfigurationsThatForget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, js := testJetStream(t)
	for _, tc := range []struct {
		cfg  jetstream.StreamConfig
		want string // "" accepted
	}{
		{jetstream.StreamConfig{Retention: jetstream.WorkQueuePolicy}, "retention WorkQueue"},
		{jetstream.StreamConfig{Retention: jetstream.InterestPolicy}, "retention Interest"},
		{jetstream.StreamConfig{MaxAge: time.Hour}, "max_age 1h0m0s"},
		{jetstream.StreamConfig{MaxMsgs: 100, Discard: jetstream.DiscardOld}, ""},
		{jetstream.StreamConfig{MaxMsgs: 100, Discard: jetstream.DiscardNew}, ""},
	} {
		name := strings.NewReplacer(" ", "_", ".", "_").Replace(tc.want)
		if name == "" {
			name = "OK" + strings.ToUpper(tc.cfg.Discard.String())
		}
		tc.cfg.Name, tc.cfg.Subjects = "S_"+name, []string{name + ".batches", name + ".batches.>"}
		if _, err := js.CreateStream(ctx, tc.cfg); err != nil {
			t.Fatal(err)
		}
		p, err := NewPublisher(ctx, nc, Destination{Name: tc.cfg.Name, Subject: name + ".batches"})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s refused: %v", tc.cfg.Name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want a refusal naming %q", tc.cfg.Name, err, tc.want)
		}
		if p != nil {
			p.Close()
		}
	}
}

// On a stream that allows direct gets, what the tailer reads back comes
// from the stream's leader all the same: a follower behind it would answer
// a direct get with what it has. A user that may not direct-get still
// opens the stream, reads its last message and the one at a sequence.
func TestReadsAskTheLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := embedded.Start(t.TempDir(), "127.0.0.1:0", func(o *server.Options) {
		o.Users = []*server.User{{Username: "tailer", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.DIRECT.GET.>"}},
		}}}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("tailer", "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "DIRECT", Subjects: []string{"mailroom.batches", "mailroom.batches.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	cfg := Destination{Name: "DIRECT", Subject: "mailroom.batches"}
	a, err := NewPublisher(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	publishWait(t, a, testMessage(1))
	publishWait(t, a, testMessage(2))
	a.Close()
	b, err := NewPublisher(ctx, nc, cfg)
	if err != nil {
		t.Fatalf("open a stream that allows direct gets: %v", err)
	}
	defer b.Close()
	if b.lastSeq != 2 || b.last.Keys != "k2" {
		t.Fatalf("last message read back: seq %d, keys %q; want 2, k2", b.lastSeq, b.last.Keys)
	}
	s, ok, err := (&streamReader{ctx: ctx, p: b}).At(1)
	if err != nil || !ok || s.Keys != "k1" {
		t.Fatalf("message 1 read back: %+v, %v, %v", s, ok, err)
	}
	if _, ok, err := (&streamReader{ctx: ctx, p: b}).At(9); err != nil || ok {
		t.Fatalf("message 9: found %v, %v; want none", ok, err)
	}
}
