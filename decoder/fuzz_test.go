package decoder

import (
	"errors"
	"github.com/mailroom/tailer/decoder/wal"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// fuzzMessages splits data into pgoutput messages: each is preceded by its
// length in one byte.
func fuzzMessages(data []byte) [][]byte {
	var msgs [][]byte
	for len(data) > 0 {
		n := int(data[0])
		data = data[1:]
		n = min(n, len(data))
		msgs = append(msgs, data[:n])
		data = data[n:]
	}
	return msgs
}

func joinMessages(msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		if len(m) > 255 {
			panic("seed message too long")
		}
		out = append(out, byte(len(m)))
		out = append(out, m...)
	}
	return out
}

// FuzzDecode feeds arbitrary message sequences to the decoder, with small
// spill and handover thresholds so that the streamed-transaction paths are
// reached: it must never panic, must report malformed input as ErrProtocol
// (or a row error, or a tokens relation without a column as a
// RelationError), and must hand every committed row over in position order.
func FuzzDecode(f *testing.F) {
	const xid = 900
	rel := relationMsg(0, 1, "public", "tokens", tokenCols...)
	srel := relationMsg(xid, 1, "public", "tokens", tokenCols...)
	tok := func(stream uint32, id int64) []byte {
		return insertMsg(stream, 1, binRow(id, "password_recovery", secret(byte(id)), binv([]byte("12345")), 1)...)
	}
	start := newMsg('S').u32(xid).u8(1).Bytes()
	stop := newMsg('E').Bytes()
	f.Add(joinMessages(rel, begin(0x100, 5), tok(0, 1), tok(0, 2), commit(0x100, 0x108)))
	f.Add(joinMessages(begin(0x100, 5), relationMsg(0, 1, "public", "tokens", "id", "action"), insertMsg(0, 1, itext(1), text("activation")), commit(0x100, 0x108)))
	f.Add(joinMessages(start, srel, tok(xid, 1), tok(xid+1, 2), tok(xid, 3), tok(xid, 4), stop,
		newMsg('A').u32(xid).u32(xid+1).Bytes(), newMsg('c').u32(xid).u8(0).u64(0x200).u64(0x208).u64(0).Bytes()))
	f.Add(joinMessages(start, srel, tok(xid, 1), stop, newMsg('A').u32(xid).u32(xid).Bytes(), start, tok(xid, 2)))
	f.Add(joinMessages(rel, begin(1, 1), insertMsg(0, 1, textRow(1, "activation", secret(1), null(), 1)...), commit(1, 2)))
	f.Add([]byte{3, 'B', 0, 0})
	f.Add(joinMessages(message(false, 0x90, HeartbeatPrefix, "1700000000000000"), rel, begin(0x100, 5), tok(0, 1), commit(0x100, 0x108)))
	f.Fuzz(func(t *testing.T, data []byte) {
		d := New("public", "tokens")
		d.SpillDir, d.HandoverChunk, d.memRows = t.TempDir(), 2, 2
		defer d.Close()
		rec := &orderSink{t: t}
		for _, m := range fuzzMessages(data) {
			err := d.Decode(m, rec)
			for err == nil && d.PartlyHandedOver() {
				_, err = d.Continue(rec)
			}
			if err != nil {
				var rel *RelationError
				if !errors.Is(err, ErrProtocol) && !errors.As(err, &rel) {
					t.Fatalf("error %v is neither ErrProtocol nor a RelationError", err)
				}
				break
			}
		}
	})
}

// orderSink checks that every transaction's rows come as one run, indexed
// from 0 without a gap, before its commit.
type orderSink struct {
	t      *testing.T
	open   bool
	commit wal.Position
}

func (s *orderSink) row(p wal.Position) {
	if !s.open {
		s.open, s.commit = true, wal.Position{Commit: p.Commit}
	}
	if p != s.commit {
		s.t.Fatalf("row at %v, want %v", p, s.commit)
	}
	s.commit.Index++
}

func (s *orderSink) Token(t *Token)                     { s.row(t.Pos) }
func (s *orderSink) BadRow(p wal.Position, _ error)     { s.row(p) }
func (s *orderSink) Heartbeat(pglogrepl.LSN, time.Time) {}

func (s *orderSink) Commit(commit, _ pglogrepl.LSN, _ time.Time) {
	if s.open && s.commit.Commit != wal.LSN(commit) {
		s.t.Fatalf("commit %v after rows of %v", commit, s.commit.Commit)
	}
	s.open = false
}

// FuzzParsePosition: any input parses or fails without panicking, and a
// parsed position prints back to a string that parses to the same position.
func FuzzParsePosition(f *testing.F) {
	for _, s := range []string{"0/16B3748:3", "FFFFFFFF/FFFFFFFF:4294967295", "0/0:0", "", ":", "0/1", "x/y:z", "0/1:-1", "1/2:3:4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePosition(s)
		if err != nil {
			return
		}
		back, err := ParsePosition(p.String())
		if err != nil || back != p {
			t.Fatalf("%q parsed to %v, whose text %q parses to %v, %v", s, p, p.String(), back, err)
		}
		if string(p.AppendText(nil)) != p.String() {
			t.Fatalf("AppendText %q != String %q", p.AppendText(nil), p.String())
		}
	})
}
