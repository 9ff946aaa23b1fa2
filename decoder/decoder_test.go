package decoder

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"github.com/mailroom/tailer/decoder/wal"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/mailroom/tailer/decoder/action"
)

// recorder is an Output that keeps everything it is given.
type recorder struct {
	tokens  []Token
	bad     []badRow
	commits [][2]pglogrepl.LSN
	beats   []beat
}

type beat struct {
	lsn pglogrepl.LSN
	at  time.Time
}

type badRow struct {
	pos wal.Position
	err error
}

func (r *recorder) Token(t *Token)                   { r.tokens = append(r.tokens, *t) }
func (r *recorder) BadRow(p wal.Position, err error) { r.bad = append(r.bad, badRow{p, err}) }
func (r *recorder) Commit(commit, end pglogrepl.LSN, _ time.Time) {
	r.commits = append(r.commits, [2]pglogrepl.LSN{commit, end})
}
func (r *recorder) Heartbeat(lsn pglogrepl.LSN, at time.Time) {
	r.beats = append(r.beats, beat{lsn, at})
}

// msg builds pgoutput messages the way the server encodes them.
type msg struct{ bytes.Buffer }

func newMsg(kind byte) *msg   { m := &msg{}; m.WriteByte(kind); return m }
func (m *msg) u8(v byte) *msg { m.WriteByte(v); return m }
func (m *msg) u16(v uint16) *msg {
	m.Write(binary.BigEndian.AppendUint16(nil, v))
	return m
}
func (m *msg) u32(v uint32) *msg {
	m.Write(binary.BigEndian.AppendUint32(nil, v))
	return m
}
func (m *msg) u64(v uint64) *msg {
	m.Write(binary.BigEndian.AppendUint64(nil, v))
	return m
}
func (m *msg) str(s string) *msg { m.WriteString(s); m.WriteByte(0); return m }

// commitMicros is 2024-01-01 00:00:00 UTC in PostgreSQL's timestamp unit.
const commitMicros = 757382400_000000

func begin(final uint64, xid uint32) []byte {
	return newMsg('B').u64(final).u64(commitMicros).u32(xid).Bytes()
}

func commit(commitLSN, end uint64) []byte {
	return newMsg('C').u8(0).u64(commitLSN).u64(end).u64(0).Bytes()
}

// relationMsg describes a relation with the given columns; streamXid > 0
// adds the xid prefix used inside a streamed chunk.
func relationMsg(streamXid, id uint32, ns, name string, cols ...string) []byte {
	m := newMsg('R')
	if streamXid > 0 {
		m.u32(streamXid)
	}
	m.u32(id).str(ns).str(name).u8('d').u16(uint16(len(cols)))
	for _, c := range cols {
		m.u8(0).str(c).u32(0).u32(0xffffffff)
	}
	return m.Bytes()
}

// col is one tuple value: kind 'n' (NULL), 't' (text) or 'b' (binary).
type col struct {
	kind byte
	val  []byte
}

func text(s string) col      { return col{'t', []byte(s)} }
func binv(b []byte) col      { return col{'b', b} }
func null() col              { return col{'n', nil} }
func i8(v int64) col         { return binv(binary.BigEndian.AppendUint64(nil, uint64(v))) }
func itext(v int64) col      { return text(strconv.FormatInt(v, 10)) }
func hexSecret(b []byte) col { return text(`\x` + hex.EncodeToString(b)) }

func insertMsg(streamXid, rel uint32, cols ...col) []byte {
	m := newMsg('I')
	if streamXid > 0 {
		m.u32(streamXid)
	}
	m.u32(rel).u8('N').u16(uint16(len(cols)))
	for _, c := range cols {
		m.u8(c.kind)
		if c.kind == 't' || c.kind == 'b' {
			m.u32(uint32(len(c.val)))
			m.Write(c.val)
		}
	}
	return m.Bytes()
}

var tokenCols = []string{"id", "action", "secret", "code", "account", "expires_at", "consumed_at", "created_at"}

func secret(seed byte) []byte {
	s := make([]byte, 32)
	for i := range s {
		s[i] = seed + byte(i)
	}
	return s
}

func textRow(id int64, action string, sec []byte, code col, account int64) []col {
	return []col{itext(id), text(action), hexSecret(sec), code, itext(account), itext(1700000000), null(), itext(1700000000)}
}

func binRow(id int64, action string, sec []byte, code col, account int64) []col {
	exp := binary.BigEndian.AppendUint32(nil, 1700000000)
	return []col{i8(id), binv([]byte(action)), binv(sec), code, i8(account), binv(exp), null(), binv(exp)}
}

func run(t *testing.T, msgs ...[]byte) (*recorder, *Decoder) {
	t.Helper()
	d := New("public", "tokens")
	rec := &recorder{}
	for i, m := range msgs {
		if err := d.Decode(m, rec); err != nil {
			t.Fatalf("message %d (%q): %v", i, m[0], err)
		}
	}
	return rec, d
}

func TestDecodeTransaction(t *testing.T) {
	for _, tc := range []struct {
		name string
		row  func(int64, string, []byte, col, int64) []col
	}{
		{"text", textRow},
		{"binary", binRow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, _ := run(t,
				relationMsg(0, 16400, "public", "tokens", tokenCols...),
				relationMsg(0, 16390, "public", "accounts", "id", "email"),
				begin(0x1000, 7),
				insertMsg(0, 16390, itext(1), text("a@b")),
				insertMsg(0, 16400, tc.row(11, "activation", secret(1), text("01234"), 1)...),
				insertMsg(0, 16400, tc.row(12, "password_recovery", secret(2), text("99999"), 2)...),
				commit(0x1000, 0x1010),
			)
			if len(rec.bad) != 0 {
				t.Fatalf("bad rows: %v", rec.bad)
			}
			if len(rec.tokens) != 2 {
				t.Fatalf("got %d tokens, want 2", len(rec.tokens))
			}
			a, r := rec.tokens[0], rec.tokens[1]
			if a.ID != 11 || a.Action != action.Activation || a.Account != 1 || a.CodeString() != "01234" ||
				!bytes.Equal(a.Secret[:], secret(1)) || a.Pos != (wal.Position{Commit: 0x1000, Index: 0}) {
				t.Errorf("activation token = %+v", a)
			}
			if r.ID != 12 || r.Action != action.PasswordRecovery || r.Account != 2 || r.CodeString() != "99999" ||
				!bytes.Equal(r.Secret[:], secret(2)) || r.Pos != (wal.Position{Commit: 0x1000, Index: 1}) {
				t.Errorf("recovery token = %+v", r)
			}
			if a.Xid != 7 || r.Xid != 7 {
				t.Errorf("xids = %d, %d, want 7", a.Xid, r.Xid)
			}
			if got := a.Committed(); !got.Equal(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)) {
				t.Errorf("commit time = %v", got)
			}
			if len(rec.commits) != 1 || rec.commits[0] != [2]pglogrepl.LSN{0x1000, 0x1010} {
				t.Errorf("commits = %v", rec.commits)
			}
		})
	}
}

func TestDecodeColumnsByName(t *testing.T) {
	cols := []string{"created_at", "account", "code", "secret", "action", "id", "extra"}
	rec, _ := run(t,
		relationMsg(0, 1, "public", "tokens", cols...),
		begin(0x2000, 1),
		insertMsg(0, 1, itext(5), itext(42), text("12345"), hexSecret(secret(9)), text("activation"), itext(77), text("x")),
		commit(0x2000, 0x2008),
	)
	if len(rec.tokens) != 1 {
		t.Fatalf("tokens = %d, bad = %v", len(rec.tokens), rec.bad)
	}
	if tok := rec.tokens[0]; tok.ID != 77 || tok.Account != 42 || tok.CodeString() != "12345" {
		t.Errorf("token = %+v", tok)
	}
}

// Integer columns of any width decode, in binary as in text: an id or
// account changed to integer or smallint does not stop the tailer.
func TestDecodeIntegerWidths(t *testing.T) {
	row := binRow(0, "activation", secret(2), text("01234"), 0)
	for _, tc := range []struct {
		name       string
		id, acct   col
		wantID, wa int64
	}{
		{"bigint", i8(-7), i8(1 << 40), -7, 1 << 40},
		{"integer", binv(binary.BigEndian.AppendUint32(nil, uint32(0xfffffff9))), binv(binary.BigEndian.AppendUint32(nil, 70000)), -7, 70000},
		{"smallint", binv(binary.BigEndian.AppendUint16(nil, 300)), binv(binary.BigEndian.AppendUint16(nil, 0xffff)), 300, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := append([]col{tc.id}, row[1:]...)
			r[4] = tc.acct
			rec, _ := run(t, relationMsg(0, 1, "public", "tokens", tokenCols...), begin(0x2000, 1), insertMsg(0, 1, r...), commit(0x2000, 0x2008))
			if len(rec.tokens) != 1 || rec.tokens[0].ID != tc.wantID || rec.tokens[0].Account != tc.wa {
				t.Fatalf("tokens = %+v, bad = %v", rec.tokens, rec.bad)
			}
		})
	}
	rec, _ := run(t, relationMsg(0, 1, "public", "tokens", tokenCols...), begin(0x2000, 1),
		insertMsg(0, 1, append([]col{binv([]byte{1, 2, 3})}, row[1:]...)...), commit(0x2000, 0x2008))
	if len(rec.bad) != 1 || !strings.Contains(rec.bad[0].err.Error(), "binary integer of 3 bytes") {
		t.Fatalf("a 3-byte integer: bad = %v", rec.bad)
	}
}

func TestDecodeBadRows(t *testing.T) {
	for _, tc := range []struct {
		name string
		row  []col
		want string
	}{
		// The token's id, once decoded, names the row.
		{"short secret", textRow(1, "activation", secret(1)[:16], text("01234"), 1), "token id 1: secret is 16 bytes, want 32"},
		{"short binary secret", binRow(1, "activation", secret(1)[:31], text("01234"), 1), "token id 1: secret is 31 bytes, want 32"},
		{"null code for recovery", textRow(1, "password_recovery", secret(1), null(), 1), "token id 1: password_recovery token has a NULL code"},
		{"short code for recovery", textRow(1, "password_recovery", secret(1), text("123"), 1), "token id 1: password_recovery token code is 3 bytes, want 5"},
		{"null id", append([]col{null()}, textRow(1, "activation", secret(1), text("0"), 1)[1:]...), "id is NULL"},
		{"escape bytea", append(textRow(1, "activation", nil, text("0"), 1)[:2], append([]col{text("abc")}, textRow(1, "activation", nil, text("0"), 1)[3:]...)...), "bytea hex format"},
		{"bad integer", append([]col{text("12a")}, textRow(1, "activation", secret(1), text("0"), 1)[1:]...), `id: "12a" is not an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, _ := run(t,
				relationMsg(0, 1, "public", "tokens", tokenCols...),
				begin(0x3000, 1),
				insertMsg(0, 1, tc.row...),
				insertMsg(0, 1, textRow(2, "activation", secret(3), text("11111"), 1)...),
				commit(0x3000, 0x3010),
			)
			if len(rec.bad) != 1 {
				t.Fatalf("bad rows = %v, want one", rec.bad)
			}
			if got := rec.bad[0].err.Error(); !strings.Contains(got, tc.want) {
				t.Errorf("error = %q, want it to contain %q", got, tc.want)
			}
			if rec.bad[0].pos != (wal.Position{Commit: 0x3000, Index: 0}) {
				t.Errorf("bad row position = %v", rec.bad[0].pos)
			}
			// The next row keeps its own position and is decoded.
			if len(rec.tokens) != 1 || rec.tokens[0].Pos != (wal.Position{Commit: 0x3000, Index: 1}) || rec.tokens[0].ID != 2 {
				t.Errorf("tokens after bad row = %+v", rec.tokens)
			}
		})
	}
}

// A token of an action the tailer does not know stops the stream at it:
// every token of that action would be a bad row, so none is skipped.
func TestDecodeUnknownAction(t *testing.T) {
	d := New("public", "tokens")
	rec := &recorder{}
	for _, m := range [][]byte{relationMsg(0, 1, "public", "tokens", tokenCols...), begin(0x10, 1)} {
		if err := d.Decode(m, rec); err != nil {
			t.Fatal(err)
		}
	}
	err := d.Decode(insertMsg(0, 1, textRow(1, "magic_link", secret(1), text("01234"), 1)...), rec)
	var action *ActionError
	if !errors.As(err, &action) || action.Label != "magic_link" {
		t.Fatalf("insert = %v, want an ActionError naming magic_link", err)
	}
	if len(rec.bad) != 0 || len(rec.tokens) != 0 {
		t.Fatalf("rows handed over: %d bad, %d tokens", len(rec.bad), len(rec.tokens))
	}
}

// A tokens relation without a column a token needs (a publication's
// column list) stops the stream at its first insert: no insert of it can
// be read, so none is a bad row to skip.
func TestDecodeRelationWithoutAColumn(t *testing.T) {
	d := New("public", "tokens")
	rec := &recorder{}
	for _, m := range [][]byte{relationMsg(0, 1, "public", "tokens", "id", "action", "account"), begin(0x10, 1)} {
		if err := d.Decode(m, rec); err != nil {
			t.Fatal(err)
		}
	}
	err := d.Decode(insertMsg(0, 1, itext(1), text("activation"), itext(1)), rec)
	var rel *RelationError
	if !errors.As(err, &rel) || strings.Join(rel.Missing, ",") != "secret,code" || !strings.Contains(err.Error(), "public.tokens") {
		t.Fatalf("insert = %v, want a RelationError naming secret and code", err)
	}
	if len(rec.bad) != 0 || len(rec.tokens) != 0 {
		t.Fatalf("rows handed over: %d bad, %d tokens", len(rec.bad), len(rec.tokens))
	}
}

func TestDecodeStreamed(t *testing.T) {
	const xid, sub = 900, 901
	rel := relationMsg(xid, 1, "public", "tokens", tokenCols...)
	row := func(streamXid uint32, id int64) []byte {
		return insertMsg(streamXid, 1, textRow(id, "activation", secret(byte(id)), text("00000"), 1)...)
	}
	streamStart := func(x uint32) []byte { return newMsg('S').u32(x).u8(1).Bytes() }
	streamStop := newMsg('E').Bytes()
	streamCommit := func(x uint32, c, e uint64) []byte {
		return newMsg('c').u32(x).u8(0).u64(c).u64(e).u64(commitMicros).Bytes()
	}
	streamAbort := func(x, s uint32) []byte { return newMsg('A').u32(x).u32(s).Bytes() }

	t.Run("commit after chunks", func(t *testing.T) {
		rec, d := run(t,
			streamStart(xid), rel, row(xid, 1), row(sub, 2), streamStop,
			streamStart(xid), row(xid, 3), streamStop,
		)
		if len(rec.tokens) != 0 || d.Pending() != 1 {
			t.Fatalf("tokens delivered before Stream Commit: %v (pending %d)", rec.tokens, d.Pending())
		}
		for _, m := range [][]byte{streamAbort(xid, sub), streamCommit(xid, 0x5000, 0x5010)} {
			if err := d.Decode(m, rec); err != nil {
				t.Fatal(err)
			}
		}
		var ids []int64
		for _, tok := range rec.tokens {
			ids = append(ids, tok.ID)
		}
		if len(ids) != 2 || ids[0] != 1 || ids[1] != 3 {
			t.Fatalf("ids = %v, want [1 3] (subtransaction 901 aborted)", ids)
		}
		if rec.tokens[1].Pos != (wal.Position{Commit: 0x5000, Index: 1}) || rec.tokens[1].Xid != xid || rec.tokens[1].CommitTime != commitMicros {
			t.Errorf("position = %v", rec.tokens[1].Pos)
		}
		if d.Pending() != 0 || len(rec.commits) != 1 || rec.commits[0][1] != 0x5010 {
			t.Errorf("pending %d commits %v", d.Pending(), rec.commits)
		}
	})
	t.Run("abort drops everything", func(t *testing.T) {
		rec, d := run(t, streamStart(xid), rel, row(xid, 1), streamStop, streamAbort(xid, xid))
		if len(rec.tokens) != 0 || len(rec.commits) != 0 || d.Pending() != 0 {
			t.Fatalf("tokens %v commits %v pending %d", rec.tokens, rec.commits, d.Pending())
		}
	})
	t.Run("interleaved with a plain transaction", func(t *testing.T) {
		rec, _ := run(t,
			streamStart(xid), rel, row(xid, 1), streamStop,
			begin(0x6000, 5), row(0, 2), commit(0x6000, 0x6008),
			streamCommit(xid, 0x7000, 0x7008),
		)
		if len(rec.tokens) != 2 || rec.tokens[0].ID != 2 || rec.tokens[1].ID != 1 {
			t.Fatalf("tokens = %+v", rec.tokens)
		}
	})
}

func TestDecodeStreamedSpillsToDisk(t *testing.T) {
	const xid, sub = 900, 901
	const rows = 3*memRows + 17
	streamStart := newMsg('S').u32(xid).u8(1).Bytes()
	streamStop := newMsg('E').Bytes()
	for _, chunk := range []int{0, 1000} {
		t.Run("chunk "+strconv.Itoa(chunk), func(t *testing.T) {
			dir := t.TempDir()
			d := New("public", "tokens")
			d.SpillDir, d.HandoverChunk = dir, chunk
			rec := &recorder{}
			feed := func(m []byte) {
				t.Helper()
				if err := d.Decode(m, rec); err != nil {
					t.Fatal(err)
				}
			}
			feed(streamStart)
			feed(relationMsg(xid, 1, "public", "tokens", tokenCols...))
			var want []int64
			for id := int64(1); id <= rows; id++ {
				x := uint32(xid)
				switch {
				case id%7 == 0:
					x = sub // rolled back below
				case id%1000 == 0:
					// A row that cannot be decoded keeps its position.
					feed(insertMsg(xid, 1, textRow(id, "activation", []byte{1, 2}, text("00000"), 1)...))
					want = append(want, -id)
					continue
				default:
					want = append(want, id)
				}
				feed(insertMsg(x, 1, binRow(id, "password_recovery", secret(byte(id)), binv([]byte("12345")), id)...))
				if id%5000 == 0 {
					feed(streamStop)
					feed(streamStart)
				}
			}
			feed(streamStop)
			if files, _ := os.ReadDir(dir); len(files) != 0 {
				t.Fatalf("spill file left visible in %s: %v", dir, files)
			}
			feed(newMsg('A').u32(xid).u32(sub).Bytes())
			feed(newMsg('c').u32(xid).u8(0).u64(0x9000).u64(0x9010).u64(commitMicros).Bytes())
			for d.PartlyHandedOver() {
				if len(rec.commits) != 0 {
					t.Fatal("commit before the last row was handed over")
				}
				if _, err := d.Continue(rec); err != nil {
					t.Fatal(err)
				}
			}
			if len(rec.commits) != 1 || rec.commits[0] != [2]pglogrepl.LSN{0x9000, 0x9010} {
				t.Fatalf("commits = %v", rec.commits)
			}
			got := make([]int64, 0, len(want))
			var index uint32
			next := func(p wal.Position) {
				t.Helper()
				if p != (wal.Position{Commit: 0x9000, Index: index}) {
					t.Fatalf("row %d at %v, want index %d", len(got), p, index)
				}
				index++
			}
			ti, bi := 0, 0
			for ti < len(rec.tokens) || bi < len(rec.bad) {
				if bi < len(rec.bad) && (ti == len(rec.tokens) || rec.bad[bi].pos.Less(rec.tokens[ti].Pos)) {
					next(rec.bad[bi].pos)
					if !strings.Contains(rec.bad[bi].err.Error(), "secret is 2 bytes") {
						t.Errorf("bad row error = %v", rec.bad[bi].err)
					}
					if w := want[len(got)]; w >= 0 {
						t.Fatalf("bad row at index %d where token %d belongs", len(got), w)
					}
					got = append(got, want[len(got)])
					bi++
					continue
				}
				tok := rec.tokens[ti]
				next(tok.Pos)
				if tok.Xid != xid || tok.Account != tok.ID || tok.Action != action.PasswordRecovery ||
					tok.CodeString() != "12345" || tok.Secret != [32]byte(secret(byte(tok.ID))) {
					t.Fatalf("token %d = %+v", tok.ID, tok)
				}
				got = append(got, tok.ID)
				ti++
			}
			if !slices.Equal(got, want) {
				t.Fatalf("got %d rows, want %d (first difference near %d)", len(got), len(want), firstDiff(got, want))
			}
		})
	}
}

func firstDiff(a, b []int64) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestDecodeInsertAfterStreamAbort(t *testing.T) {
	const xid = 900
	d := New("public", "tokens")
	rec := &recorder{}
	for _, m := range [][]byte{
		newMsg('S').u32(xid).u8(1).Bytes(),
		relationMsg(xid, 1, "public", "tokens", tokenCols...),
		insertMsg(xid, 1, textRow(1, "activation", secret(1), text("00000"), 1)...),
		newMsg('A').u32(xid).u32(xid).Bytes(),
	} {
		if err := d.Decode(m, rec); err != nil {
			t.Fatal(err)
		}
	}
	err := d.Decode(insertMsg(xid, 1, textRow(2, "activation", secret(2), text("00000"), 1)...), rec)
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("insert after the transaction's Stream Abort: err = %v, want ErrProtocol", err)
	}
}

func TestDecodeProtocolErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		msgs [][]byte
	}{
		{"unknown type", [][]byte{{'Z'}}},
		{"empty", [][]byte{{}}},
		{"short begin", [][]byte{{'B', 0, 0}}},
		{"unknown relation", [][]byte{begin(1, 1), insertMsg(0, 99, itext(1))}},
		{"truncated tuple", [][]byte{
			relationMsg(0, 1, "public", "tokens", tokenCols...), begin(1, 1),
			insertMsg(0, 1, textRow(1, "activation", secret(1), text("0"), 1)...)[:20],
		}},
		{"unterminated relation name", [][]byte{{'R', 0, 0, 0, 1, 'p'}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New("public", "tokens")
			var err error
			for _, m := range tc.msgs {
				if err = d.Decode(m, &recorder{}); err != nil {
					break
				}
			}
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
		})
	}
}

func TestPositionText(t *testing.T) {
	for _, p := range []wal.Position{{Commit: 0, Index: 0}, {Commit: 0x16B3748, Index: 3}, {Commit: 0xFFFFFFFF_FFFFFFFF, Index: 4294967295}, {Commit: 1 << 32, Index: 12}} {
		s := p.String()
		if got := string(p.AppendText(nil)); got != s {
			t.Errorf("AppendText = %q, String = %q", got, s)
		}
		back, err := ParsePosition(s)
		if err != nil || back != p {
			t.Errorf("ParsePosition(%q) = %v, %v", s, back, err)
		}
	}
	for _, bad := range []string{"", "0/10", "0/10:x", "zz:1"} {
		if _, err := ParsePosition(bad); err == nil {
			t.Errorf("ParsePosition(%q) succeeded", bad)
		}
	}
	if !(wal.Position{Commit: 1, Index: 5}).Less(wal.Position{Commit: 2, Index: 0}) || (wal.Position{Commit: 2, Index: 0}).Less(wal.Position{Commit: 1, Index: 5}) || !(wal.Position{Commit: 2, Index: 0}).Less(wal.Position{Commit: 2, Index: 1}) {
		t.Error("Less is not commit order")
	}
}

func TestAtoi(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "42": 42, "-7": -7, "9223372036854775807": 9223372036854775807, "-9223372036854775808": -9223372036854775808} {
		if got, ok := atoi([]byte(in)); !ok || got != want {
			t.Errorf("atoi(%q) = %d, %v", in, got, ok)
		}
	}
	for _, in := range []string{"", "-", "9223372036854775808", "1x", "99999999999999999999"} {
		if _, ok := atoi([]byte(in)); ok {
			t.Errorf("atoi(%q) succeeded", in)
		}
	}
}

// benchInserts are the insert messages the decoding benchmarks read.
var benchInserts = []struct {
	name string
	msg  []byte
}{
	{"text", insertMsg(0, 1, textRow(1, "activation", secret(1), text("01234"), 1)...)},
	{"binary", insertMsg(0, 1, binRow(1, "activation", secret(1), text("01234"), 1)...)},
}

func BenchmarkDecodeInsert(b *testing.B) {
	d, rec := insertDecoder(b)
	for _, tc := range benchInserts {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := d.Decode(tc.msg, rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPglogreplParseV2 is what the decoder replaced: pglogrepl's
// parser on the same messages, before any column is interpreted.
func BenchmarkPglogreplParseV2(b *testing.B) {
	for _, tc := range benchInserts {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := pglogrepl.ParseV2(tc.msg, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type countSink struct{ n int }

func (c *countSink) Token(*Token)                           { c.n++ }
func (c *countSink) BadRow(wal.Position, error)             {}
func (c *countSink) Commit(_, _ pglogrepl.LSN, _ time.Time) {}
func (c *countSink) Heartbeat(pglogrepl.LSN, time.Time)     {}

func message(transactional bool, lsn uint64, prefix, content string) []byte {
	var flags byte
	if transactional {
		flags = 1
	}
	m := newMsg('M').u8(flags).u64(lsn).str(prefix).u32(uint32(len(content)))
	m.WriteString(content)
	return m.Bytes()
}

// Heartbeats are the tailer's non-transactional messages whose content is
// a time; every other logical message is passed over, and one cut short
// is a protocol error.
func TestHeartbeat(t *testing.T) {
	at := time.UnixMicro(1_700_000_000_123_456)
	for _, tc := range []struct {
		name  string
		msg   []byte
		beats []beat
		err   bool
	}{
		{"heartbeat", message(false, 0x10, HeartbeatPrefix, HeartbeatContent(at)), []beat{{0x10, at}}, false},
		{"transactional", message(true, 0x10, HeartbeatPrefix, HeartbeatContent(at)), nil, false},
		{"other prefix", message(false, 0x10, "app", HeartbeatContent(at)), nil, false},
		{"not a time", message(false, 0x10, HeartbeatPrefix, "soon"), nil, false},
		{"negative", message(false, 0x10, HeartbeatPrefix, "-5"), nil, false},
		{"cut short", message(false, 0x10, HeartbeatPrefix, "1700")[:30], nil, true},
		{"no content length", newMsg('M').u8(0).u64(0x10).str(HeartbeatPrefix).Bytes(), nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r recorder
			err := New("public", "tokens").Decode(tc.msg, &r)
			if (err != nil) != tc.err || (err != nil && !errors.Is(err, ErrProtocol)) {
				t.Fatalf("err = %v, want a protocol error: %v", err, tc.err)
			}
			if !slices.EqualFunc(r.beats, tc.beats, func(a, b beat) bool { return a.lsn == b.lsn && a.at.Equal(b.at) }) {
				t.Fatalf("heartbeats %v, want %v", r.beats, tc.beats)
			}
		})
	}
}

// Decoding an insert allocates nothing: the decoder reads the columns it
// needs in place (docs/performance.md). A string of the action label, a
// copy made per row, went unnoticed for a day: 16 bytes a token.
func TestDecodeInsertAllocatesNothing(t *testing.T) {
	d, rec := insertDecoder(t)
	for _, tc := range benchInserts {
		allocs := testing.AllocsPerRun(100, func() {
			if err := d.Decode(tc.msg, rec); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("decoding a %s insert: %.0f allocations, want none", tc.name, allocs)
		}
	}
}

// insertDecoder is a decoder inside a transaction of the tokens table,
// ready for benchInserts, and the output it counts them into.
func insertDecoder(tb testing.TB) (*Decoder, *countSink) {
	tb.Helper()
	d := New("public", "tokens")
	rec := &countSink{}
	for _, m := range [][]byte{relationMsg(0, 1, "public", "tokens", tokenCols...), begin(0x10, 1)} {
		if err := d.Decode(m, rec); err != nil {
			tb.Fatal(err)
		}
	}
	return d, rec
}
