package publish

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/wire"
)

// Resume trusts the positions of the stream's messages only when they are
// the owner's: after its Since, of its origin and incarnation (or without
// one, for a legacy slot), and not ahead of the server's WAL.
func TestResume(t *testing.T) {
	here := Origin{SystemID: "1", Timeline: 1, Database: "mailroom"}
	pos := decoder.Position{Commit: 0x5000, Index: 2}
	type msg struct{ origin, incarnation string }
	for _, tc := range []struct {
		name    string
		stored  []msg
		owner   Owner
		current pglogrepl.LSN
		want    string // in the error; "" for none
		resume  bool   // LastPosition is pos
	}{
		{name: "empty stream", owner: Owner{Origin: here, Incarnation: "a"}, current: 0x6000},
		{name: "its own", stored: []msg{{here.String(), "a"}}, owner: Owner{Origin: here, Incarnation: "a"}, current: 0x6000, resume: true},
		{name: "another incarnation", stored: []msg{{here.String(), "a"}}, owner: Owner{Origin: here, Incarnation: "b"}, current: 0x6000,
			want: "another incarnation of the slot"},
		{name: "another incarnation before the takeover", stored: []msg{{here.String(), "a"}}, owner: Owner{Origin: here, Incarnation: "b", Since: 1}, current: 0x6000},
		{name: "the takeover, then its own", stored: []msg{{here.String(), "a"}, {here.String(), "b"}}, owner: Owner{Origin: here, Incarnation: "b", Since: 1},
			current: 0x6000, resume: true},
		{name: "an older tailer's, legacy slot", stored: []msg{{"", ""}}, owner: Owner{Origin: here, Incarnation: "a", Legacy: true}, current: 0x6000, resume: true},
		{name: "an older tailer's, new slot", stored: []msg{{"", ""}}, owner: Owner{Origin: here, Incarnation: "a"}, current: 0x6000,
			want: "no incarnation"},
		{name: "another database", stored: []msg{{"2/1/mailroom", "a"}}, owner: Owner{Origin: here, Incarnation: "a"}, current: 0x6000,
			want: "published from another database"},
		{name: "the same system on its next timeline (a promoted standby)", stored: []msg{{"1/1/mailroom", "a"}},
			owner: Owner{Origin: Origin{SystemID: "1", Timeline: 2, Database: "mailroom", History: map[int32]pglogrepl.LSN{1: 0x5800}}, Incarnation: "a"}, current: 0x6000, resume: true},
		{name: "the same system on a later timeline that branched before the stream's last batch", stored: []msg{{"1/1/mailroom", "a"}},
			owner: Owner{Origin: Origin{SystemID: "1", Timeline: 3, Database: "mailroom", History: map[int32]pglogrepl.LSN{1: 0x4000, 2: 0x5800}}, Incarnation: "a"}, current: 0x6000,
			want: "past the point where this server's timeline branched"},
		{name: "the same system on a later timeline without its history", stored: []msg{{"1/1/mailroom", "a"}},
			owner: Owner{Origin: Origin{SystemID: "1", Timeline: 2, Database: "mailroom"}, Incarnation: "a"}, current: 0x6000, want: "published from another database"},
		{name: "the same system on an earlier timeline", stored: []msg{{"1/3/mailroom", "a"}}, owner: Owner{Origin: here, Incarnation: "a"}, current: 0x6000,
			want: "published from another database"},
		{name: "another database of the same system", stored: []msg{{"1/1/other", "a"}}, owner: Owner{Origin: here, Incarnation: "a"}, current: 0x6000,
			want: "published from another database"},
		{name: "a copy on a new timeline, slot made again", stored: []msg{{"1/1/mailroom", "a"}}, owner: Owner{Origin: Origin{SystemID: "1", Timeline: 2, Database: "mailroom", History: map[int32]pglogrepl.LSN{1: 0x9000}}, Incarnation: "b"},
			current: 0x6000, want: "another incarnation of the slot"},
		{name: "ahead of the WAL", stored: []msg{{here.String(), "a"}}, owner: Owner{Origin: here, Incarnation: "a"}, current: 0x4000,
			want: "ahead of this server's WAL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			nc, js := testJetStream(t)
			dest := Destination{Name: "S", Subject: "mailroom.batches", Origin: here}
			seed, err := NewPublisher(ctx, nc, dest)
			if err != nil {
				t.Fatal(err)
			}
			seed.Close()
			for _, m := range tc.stored {
				nm := nats.NewMsg("mailroom.batches")
				nm.Header.Set(wire.HeaderPosLast, pos.String())
				if m.origin != "" {
					nm.Header.Set(wire.HeaderOrigin, m.origin)
				}
				if m.incarnation != "" {
					nm.Header.Set(wire.HeaderIncarnation, m.incarnation)
				}
				nm.Data = []byte("x")
				if _, err := js.PublishMsg(ctx, nm); err != nil {
					t.Fatal(err)
				}
			}
			p, err := NewPublisher(ctx, nc, dest)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			err = p.Resume(tc.owner, tc.current)
			var foreign *ErrForeignStream
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Resume: %v", err)
			case tc.want != "" && (!errors.As(err, &foreign) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "tailer resync")):
				t.Fatalf("Resume = %v, want a refusal saying %q and naming tailer resync", err, tc.want)
			case tc.want != "":
				return
			}
			if got := p.LastPosition(0); (got == pos) != tc.resume {
				t.Fatalf("LastPosition = %s, resume from %s: %v", got, pos, tc.resume)
			}
			// What it publishes now names the owner.
			fut, err := p.PublishAsync(testMessage(0x5001))
			if err != nil {
				t.Fatal(err)
			}
			var seq uint64
			select {
			case ack := <-fut.Ok():
				seq = ack.Sequence
			case err := <-fut.Err():
				t.Fatal(err)
			}
			stored, err := p.Stream().GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			if got := stored.Header.Get(wire.HeaderIncarnation); got != tc.owner.Incarnation {
				t.Fatalf("published with incarnation %q, want %q", got, tc.owner.Incarnation)
			}
		})
	}
}
