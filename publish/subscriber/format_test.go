package subscriber_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/mailroom/tailer/publish/subscriber/protocol"
	"strings"
	"testing"
	"time"

	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/wire"
)

// previousRecord is the durable's record as the release before the
// record's format read it: every field known, no other taken.
type previousRecord struct {
	Last          wire.Anchor                 `json:"last,omitzero"`
	Chain         wire.Chain                  `json:"chain,omitempty"`
	StreamCreated time.Time                   `json:"stream_created,omitzero"`
	Floor         uint64                      `json:"floor"`
	Messages      map[uint64]*previousMessage `json:"messages,omitempty"`
}

type previousMessage struct {
	Mark     string           `json:"mark,omitempty"`
	Batches  int              `json:"batches"`
	Done     protocol.Batches `json:"done,omitempty"`
	Acked    bool             `json:"acked,omitempty"`
	Attempts map[int]int      `json:"attempts,omitempty"`
}

// A record of format 1 is one the release before reads (a rolling
// downgrade); one of a later format is read for what this release knows
// of it while it needs no more, and refused, naming the way back, once it
// does.
func TestRecordFormats(t *testing.T) {
	p := protocol.Progress{Floor: 7, Last: wire.Anchor{Seq: 9, Mark: "id:9"}, Messages: map[uint64]*protocol.MessageProgress{
		8: {Mark: "id:8", Batches: 3, Done: protocol.Batches{}, Acked: false, Attempts: map[int]int{2: 1}},
	}}
	p.Messages[8].Done.Add(0)
	data, err := json.Marshal(&p)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var prev previousRecord
	if err := dec.Decode(&prev); err != nil {
		t.Fatalf("the release before cannot read %s: %v", data, err)
	}
	if prev.Floor != 7 || !prev.Messages[8].Done.Has(0) {
		t.Fatalf("the release before reads %s as %+v", data, prev)
	}

	later := `{"version":2,"floor":7,"later":{"x":[1,2]},"messages":{"8":{"batches":3,"done":"0-1","later":true}}}`
	got, err := protocol.ParseProgress([]byte(later))
	if err != nil {
		t.Fatalf("a later release's record that needs no more than format 1: %v", err)
	}
	if got.Floor != 7 || !got.Messages[8].Done.Has(1) {
		t.Fatalf("%s read as %+v", later, got)
	}

	for _, ahead := range []string{`{"version":2,"needs":2,"floor":7}`, `{"needs":3}`} {
		_, err := protocol.ParseProgress([]byte(ahead))
		if !errors.Is(err, protocol.ErrRecordAhead) {
			t.Fatalf("%s: %v, want ErrRecordAhead", ahead, err)
		}
		if !strings.Contains(err.Error(), "run this durable's subscribers from the release that wrote it") {
			t.Fatalf("%s: %q names no way back", ahead, err)
		}
	}
}

// A subscriber meets its durable's record as a later release wrote it:
// one that needs no more than this release's format is honoured (the
// batch it says is done is not written again) and written back in this
// release's format; one that needs more stops the subscriber before it
// writes a line, naming the way back.
func TestRecordOfALaterRelease(t *testing.T) {
	for _, tc := range []struct {
		name, record string
		ahead        bool
	}{
		{name: "needs format 1", record: `{"version":2,"floor":0,"later":{"x":1},"messages":{"1":{"batches":2,"done":"0","later":true}}}`},
		{name: "needs format 2", record: `{"version":2,"needs":2,"floor":0,"messages":{"1":{"batches":2,"done":"0"}}}`, ahead: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			js, r, sub := pipeSubscriber(ctx, t, 5*time.Second, nil)
			kv, err := js.KeyValue(ctx, subscriber.ProgressBucket("S"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kv.Put(ctx, "d", []byte(tc.record)); err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			done := make(chan error, 1)
			go func() { done <- sub.Run(runCtx, js) }()
			if tc.ahead {
				select {
				case err := <-done:
					if !errors.Is(err, protocol.ErrRecordAhead) {
						t.Fatalf("Run = %v, want ErrRecordAhead", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the subscriber goes on with a record it cannot honour")
				}
				if st := sub.Stats(); st.Batches != 0 || st.Messages != 0 {
					t.Fatalf("stats %+v: something was handed on", st)
				}
				return
			}
			// A subscriber that stopped writes nothing more: no wait forever.
			if err := r.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
				t.Fatal(err)
			}
			lines := bufio.NewReader(r)
			for i := range 5 {
				line, err := lines.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				// Message 1's first batch (two tokens) is done by the record.
				if n := len(strings.Split(strings.TrimSuffix(line, "\n"), ",")); i == 0 && n != 5 {
					t.Fatalf("the first line holds %d fields, want the one-token batch the record does not say is done", n)
				}
			}
			deadline := time.Now().Add(10 * time.Second)
			for sub.Stats().Messages < 3 || sub.Stats().Batches < 4 {
				if time.Now().After(deadline) {
					t.Fatalf("stats %+v: want the 3 messages delivered, every batch done but the last", sub.Stats())
				}
				time.Sleep(50 * time.Millisecond)
			}
			stop()
			<-done
			e, err := kv.Get(ctx, "d")
			if err != nil {
				t.Fatal(err)
			}
			dec := json.NewDecoder(bytes.NewReader(e.Value()))
			dec.DisallowUnknownFields()
			var prev previousRecord
			if err := dec.Decode(&prev); err != nil {
				t.Fatalf("the record written back, %s, is not of format 1: %v", e.Value(), err)
			}
		})
	}
}
