package subscriber

import (
	"context"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/embedded"
)

// flakyProgress fails its first loads with err.
type flakyProgress struct {
	fails int
	err   error
	loads int
}

func (f *flakyProgress) Load(context.Context) (protocol.Progress, uint64, error) {
	if f.loads++; f.loads <= f.fails {
		return protocol.Progress{}, 0, f.err
	}
	return protocol.Progress{Floor: 7}, 3, nil
}

func (f *flakyProgress) Save(context.Context, *protocol.Progress, uint64) (uint64, error) {
	return 0, nil
}

// A record the server cannot give now (a node lost, a leader being
// elected) is asked for again; one that does not parse is an error at once.
func TestLoadProgressRetries(t *testing.T) {
	ctx := context.Background()
	flaky := &flakyProgress{fails: 2, err: nats.ErrNoResponders}
	s := &Subscriber{cfg: Config{Progress: flaky}}
	waits := 0
	p, rev, err := s.loadProgress(ctx, func() { waits++ })
	if err != nil || p.Floor != 7 || rev != 3 || flaky.loads != 3 || waits != 2 {
		t.Fatalf("after two failures: %+v rev %d err %v, %d loads, %d waits", p, rev, err, flaky.loads, waits)
	}
	bad := &flakyProgress{fails: 5, err: fmt.Errorf("read progress of d: %w", ErrUnreadableProgress)}
	s = &Subscriber{cfg: Config{Progress: bad}}
	if _, _, err := s.loadProgress(ctx, func() {}); !errors.Is(err, ErrUnreadableProgress) || bad.loads != 1 {
		t.Fatalf("an unreadable record: %v after %d loads, want the error after one", err, bad.loads)
	}
}

// unanswered is a record whose first read is never answered: a bucket's
// leader frozen.
type unanswered struct{ loads int }

func (u *unanswered) Load(ctx context.Context) (protocol.Progress, uint64, error) {
	if u.loads++; u.loads == 1 {
		<-ctx.Done()
		return protocol.Progress{}, 0, ctx.Err()
	}
	return protocol.Progress{Floor: 9}, 4, nil
}

func (u *unanswered) Save(context.Context, *protocol.Progress, uint64) (uint64, error) { return 0, nil }

// A read of the record that goes unanswered is given up after a try's
// time and asked again (issue 49: a read asked of a frozen leader waited
// 10 s, and a pinned pair went 19-31 s without a line).
func TestProgressReadAskedAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := &unanswered{}
	s := &Subscriber{cfg: Config{Progress: u}}
	start := time.Now()
	p, rev, err := s.loadProgress(ctx, func() {})
	if took := time.Since(start); err != nil || p.Floor != 9 || rev != 4 || took > 2*progressTry {
		t.Fatalf("loadProgress = %+v, %d, %v after %s and %d reads; want the record, asked again after %s", p, rev, err, took.Round(time.Millisecond), u.loads, progressTry)
	}
}

// saveless is a record that holds none of what a subscriber finished: its
// saves never land.
type saveless struct{}

func (saveless) Load(context.Context) (protocol.Progress, uint64, error) {
	return protocol.Progress{Floor: 1}, 3, nil
}

func (saveless) Save(context.Context, *protocol.Progress, uint64) (uint64, error) {
	return 0, nats.ErrNoResponders
}

// A subscriber that loses its pin with a batch done and unsaved keeps it
// done as it stands by: pinned again, it does not write that batch again
// (issue 49's fault runs: three of one subscriber's batches written again
// at one fault, one of them by itself, pinned again a moment later).
func TestStandbyKeepsWhatItFinished(t *testing.T) {
	var h protocol.Machine
	h.Record.MessageAt(5, "m5", 2).Done.Add(0)
	h.Dirty, h.DoneUnsaved = true, 1
	s := kept(t, &Subscriber{cfg: Config{Progress: saveless{}}}, h)
	s.loaded.Store(true)
	if err := s.standBy(context.Background(), errPinLost); err != nil {
		t.Fatal(err)
	}
	h = s.keep.stop()
	m := h.Record.Messages[5]
	if m == nil || !m.Done.Has(0) || h.Rev != 3 || h.Record.Floor != 1 {
		t.Fatalf("after standing by: record %+v (message 5: %+v) at revision %d; want the record read (floor 1, revision 3) with message 5's batch 0 done", h.Record, m, h.Rev)
	}
}

// A record read that the server answers "JetStream system temporarily
// unavailable", twice, moves the subscriber to another server of its
// list: a server cut off from its cluster says it to every read until the
// cut heals (a standby on a partitioned node waited out a 60 s partition
// asking it, TestFrozenStreamLeader in CI).
func TestCutOffReadMovesTheConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var urls []string
	for range 2 {
		srv, err := embedded.Start(t.TempDir(), "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		urls = append(urls, srv.ClientURL())
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.DontRandomize())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	first := nc.ConnectedUrl()
	cutOff := &flakyProgress{fails: 3, err: &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}}
	s := &Subscriber{cfg: Config{Progress: cutOff, Durable: "d"}, js: js}
	if _, _, err := s.loadProgress(ctx, func() {}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); nc.ConnectedUrl() == first || !nc.IsConnected(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still on %s after %d reads answered 'temporarily unavailable'; want another server", nc.ConnectedUrl(), cutOff.loads)
		}
	}
}
