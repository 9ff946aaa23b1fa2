package publish

import (
	"context"
	"errors"
	"github.com/mailroom/tailer/decoder/wal"
	"github.com/mailroom/tailer/publish/relay"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

// Resume refuses a stream whose messages since the owner's Since are not
// the owner's: of another origin (but a later timeline of the same system
// that branched at or after them) or another incarnation (but none, for a
// legacy slot). What it accepts, it resumes by content: the tokens of the
// owner's messages are on the stream, whatever their positions.
func TestResume(t *testing.T) {
	here := relay.Origin{SystemID: "1", Timeline: 1, Database: "mailroom"}
	pos := wal.Position{Commit: 0x5000, Index: 2}
	type msg struct{ origin, incarnation string }
	for _, tc := range []struct {
		name   string
		stored []msg
		owner  relay.Owner
		want   string // in the error; "" for none
		resume bool   // the stored token is on the stream
	}{
		{name: "empty stream", owner: relay.Owner{Origin: here, Incarnation: "a"}},
		{name: "its own", stored: []msg{{here.String(), "a"}}, owner: relay.Owner{Origin: here, Incarnation: "a"}, resume: true},
		{name: "another incarnation", stored: []msg{{here.String(), "a"}}, owner: relay.Owner{Origin: here, Incarnation: "b"},
			want: "another incarnation of the slot"},
		{name: "another incarnation before the takeover", stored: []msg{{here.String(), "a"}}, owner: relay.Owner{Origin: here, Incarnation: "b", Since: 1}},
		{name: "the takeover, then its own", stored: []msg{{here.String(), "a"}, {here.String(), "b"}}, owner: relay.Owner{Origin: here, Incarnation: "b", Since: 1},
			resume: true},
		{name: "an older tailer's, legacy slot", stored: []msg{{"", ""}}, owner: relay.Owner{Origin: here, Incarnation: "a", Legacy: true}, resume: true},
		{name: "an older tailer's, new slot", stored: []msg{{"", ""}}, owner: relay.Owner{Origin: here, Incarnation: "a"},
			want: "no incarnation"},
		{name: "another database", stored: []msg{{"2/1/mailroom", "a"}}, owner: relay.Owner{Origin: here, Incarnation: "a"},
			want: "published from another database"},
		{name: "the same system on its next timeline (a promoted standby)", stored: []msg{{"1/1/mailroom", "a"}},
			owner: relay.Owner{Origin: relay.Origin{SystemID: "1", Timeline: 2, Database: "mailroom", History: map[int32]wal.LSN{1: 0x5800}}, Incarnation: "a"}, resume: true},
		{name: "the same system on a later timeline that branched before the stream's last batch", stored: []msg{{"1/1/mailroom", "a"}},
			owner: relay.Owner{Origin: relay.Origin{SystemID: "1", Timeline: 3, Database: "mailroom", History: map[int32]wal.LSN{1: 0x4000, 2: 0x5800}}, Incarnation: "a"},
			want:  "past the point where this server's timeline branched"},
		{name: "the same system on a later timeline without its history", stored: []msg{{"1/1/mailroom", "a"}},
			owner: relay.Owner{Origin: relay.Origin{SystemID: "1", Timeline: 2, Database: "mailroom"}, Incarnation: "a"}, want: "published from another database"},
		{name: "the same system on an earlier timeline", stored: []msg{{"1/3/mailroom", "a"}}, owner: relay.Owner{Origin: here, Incarnation: "a"},
			want: "published from another database"},
		{name: "another database of the same system", stored: []msg{{"1/1/other", "a"}}, owner: relay.Owner{Origin: here, Incarnation: "a"},
			want: "published from another database"},
		{name: "a copy on a new timeline, slot made again", stored: []msg{{"1/1/mailroom", "a"}}, owner: relay.Owner{Origin: relay.Origin{SystemID: "1", Timeline: 2, Database: "mailroom", History: map[int32]wal.LSN{1: 0x9000}}, Incarnation: "b"},
			want: "another incarnation of the slot"},
		{name: "positions ahead of the server's WAL (a restore): resumed by content", stored: []msg{{here.String(), "a"}}, owner: relay.Owner{Origin: here, Incarnation: "a", After: 0x4000},
			resume: true},
		{name: "a message that is not a batch", stored: []msg{{"stray", ""}}, owner: relay.Owner{Origin: here, Incarnation: "a"}},
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
			tok := testToken(1, pos)
			for _, m := range tc.stored {
				nm := nats.NewMsg("mailroom.batches")
				if m.origin != "stray" {
					nm.Header.Set(wire.HeaderPosLast, pos.String())
					nm.Header.Set(wire.HeaderCount, "1")
					nm.Header.Set(wire.HeaderTokenKeys, keyOf(tok))
				}
				if m.origin != "" && m.origin != "stray" {
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
			err = p.Resume(ctx, tc.owner)
			var foreign *relay.ForeignStreamError
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Resume: %v", err)
			case tc.want != "" && (!errors.As(err, &foreign) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Resume = %v, want a refusal saying %q", err, tc.want)
			case tc.want != "":
				return
			}
			if got, err := p.OnStream(ctx, tok); got != tc.resume || err != nil {
				t.Fatalf("OnStream = %v, %v; want %v", got, err, tc.resume)
			}
			if on, err := p.OnStream(ctx, testToken(2, pos)); on || err != nil {
				t.Fatalf("a token of another key at the same position: OnStream = %v, %v", on, err)
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

// testToken is a token whose secret starts with b.
func testToken(b byte, pos wal.Position) *decoder.Token {
	t := &decoder.Token{Pos: pos}
	t.Secret[0] = b
	return t
}

func keyOf(t *decoder.Token) string { return string(token.AppendKey(nil, &t.Secret)) }
