package decoder

import (
	"testing"
)

const (
	traceA = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traceB = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
)

// A transaction's rows after its traceparent carry it; rows before it,
// other transactions, other prefixes, non-transactional and malformed
// traceparents carry none.
func TestDecodeTraceparent(t *testing.T) {
	rel := relationMsg(0, 1, "public", "tokens", tokenCols...)
	row := func(streamXid uint32, id int64) []byte {
		return insertMsg(streamXid, 1, textRow(id, "activation", secret(byte(id)), text("00000"), 1)...)
	}
	tm := func(v string) []byte { return message(true, 0, TraceparentPrefix, v) }
	rec, _ := run(t, rel,
		begin(0x1000, 5), row(0, 1), tm(traceA), row(0, 2), row(0, 3), commit(0x1000, 0x1008),
		begin(0x2000, 6), row(0, 4), commit(0x2000, 0x2008),
		begin(0x3000, 7), tm("00-bad"), message(true, 0, "app", traceB), message(false, 0, TraceparentPrefix, traceB), row(0, 5),
		tm(traceB), tm(traceA), row(0, 6), commit(0x3000, 0x3008),
	)
	want := map[int64]string{1: "", 2: traceA, 3: traceA, 4: "", 5: "", 6: traceA}
	if len(rec.tokens) != len(want) {
		t.Fatalf("%d tokens", len(rec.tokens))
	}
	for _, tok := range rec.tokens {
		if tok.Trace != want[tok.ID] {
			t.Errorf("token %d carries %q, want %q", tok.ID, tok.Trace, want[tok.ID])
		}
	}
}

// The same for a streamed transaction, rows in memory and spilled: the
// marks follow the rows, and one written in a subtransaction rolled back
// does not count.
func TestDecodeStreamedTraceparent(t *testing.T) {
	const xid, sub = 900, 901
	rel := relationMsg(xid, 1, "public", "tokens", tokenCols...)
	row := func(x uint32, id int64) []byte {
		return insertMsg(x, 1, textRow(id, "activation", secret(byte(id)), text("00000"), 1)...)
	}
	tm := func(x uint32, v string) []byte {
		m := newMsg('M').u32(x).u8(1).u64(0).str(TraceparentPrefix).u32(uint32(len(v)))
		m.WriteString(v)
		return m.Bytes()
	}
	streamStart := newMsg('S').u32(xid).u8(1).Bytes()
	streamStop := newMsg('E').Bytes()
	d := New("public", "tokens")
	d.memRows, d.SpillDir = 2, t.TempDir()
	var rec recorder
	for _, m := range [][]byte{
		streamStart, rel, row(xid, 1), tm(xid, traceA), row(xid, 2), streamStop,
		streamStart, row(xid, 3), tm(sub, traceB), row(sub, 4), row(xid, 5), streamStop,
		newMsg('A').u32(xid).u32(sub).Bytes(),
		newMsg('c').u32(xid).u8(0).u64(0x5000).u64(0x5010).u64(commitMicros).Bytes(),
	} {
		if err := d.Decode(m, &rec); err != nil {
			t.Fatal(err)
		}
	}
	want := map[int64]string{1: "", 2: traceA, 3: traceA, 5: traceA}
	if len(rec.tokens) != len(want) {
		t.Fatalf("tokens %+v", rec.tokens)
	}
	for _, tok := range rec.tokens {
		if tok.Trace != want[tok.ID] {
			t.Errorf("token %d carries %q, want %q", tok.ID, tok.Trace, want[tok.ID])
		}
	}
}
