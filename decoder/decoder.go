package decoder

import (
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/mailroom/tailer/decoder/action"
)

// Output receives what the decoder finds, in commit order. The decoder calls
// it synchronously; a *Token is only valid for the duration of the call.
type Output interface {
	// Token is called for every well-formed insert into the tokens table.
	Token(t *Token)
	// BadRow is called for an insert into the tokens table that cannot be
	// turned into a Token. The row still occupies its position.
	BadRow(pos wal.Position, err error)
	// Commit is called when a transaction that touched published tables
	// ends; endLSN is the position the slot may be confirmed to once every
	// row of the transaction has been handled, at its commit time
	// (PostgreSQL's clock).
	Commit(commitLSN, endLSN pglogrepl.LSN, at time.Time)
	// Heartbeat is called for a heartbeat in the WAL (see
	// HeartbeatPrefix): everything committed before at lies before lsn.
	Heartbeat(lsn pglogrepl.LSN, at time.Time)
}

// ErrProtocol marks a message that does not follow the pgoutput format. It is
// not a bad row: the stream itself cannot be trusted past it.
var ErrProtocol = errors.New("pgoutput protocol error")

// Decoder holds the state pgoutput messages depend on: the relations seen so
// far, the transaction in progress and the streamed transactions not yet
// committed. The zero value is not usable; call New.
type Decoder struct {
	schema, table string

	relations map[uint32]*relation

	// inTx is set between Begin and Commit of a non-streamed transaction.
	inTx     bool
	txCommit pglogrepl.LSN
	txXid    uint32
	txTime   int64
	txIndex  uint32
	// txTrace is the traceparent the transaction's next rows carry.
	txTrace string

	// inStream is set between Stream Start and Stream Stop; streamXid is the
	// top-level transaction the chunk belongs to.
	inStream  bool
	streamXid uint32
	streams   map[uint32]*streamedTx

	// SpillDir is where rows of large streamed transactions are buffered
	// (os.TempDir() when empty).
	SpillDir string
	// HandoverChunk, when positive, is the most rows of a committed
	// streamed transaction that one call hands to the Output; the caller
	// continues with Continue. Zero hands the whole transaction over at once.
	HandoverChunk int
	handing       *handover
	// memRows is memRows but for tests, which spill sooner.
	memRows int

	// tok is the scratch row handed to the Output; reusing it keeps the
	// interface call from moving every row to the heap.
	tok Token
}

// New returns a Decoder for inserts into schema.table (normally
// public.tokens).
func New(schema, table string) *Decoder {
	return &Decoder{
		schema:    schema,
		table:     table,
		relations: make(map[uint32]*relation),
		streams:   make(map[uint32]*streamedTx),
		memRows:   memRows,
	}
}

// relation maps the columns the tailer needs to their index in a tuple.
// Columns are found by name so that column order and added columns do not
// matter.
type relation struct {
	isTokens                                         bool
	ncols                                            int
	colID, colAction, colSecret, colCode, colAccount int
	// missing names the columns a token needs that the tokens relation,
	// as the stream describes it, lacks.
	missing []string
}

// RelationError is the tokens relation described by the stream without
// columns a token needs: the publication's column list leaves them out, or
// they were dropped. It is not a bad row: the slot decodes every insert
// of that time with the relation as it was then, however often it is
// replayed, so no insert of it can be read from the slot.
type RelationError struct {
	Relation string
	Missing  []string
}

func (e *RelationError) Error() string {
	return fmt.Sprintf("the replication stream describes table %s without column(s) %s that a token needs (a column list of the publication, or columns dropped)",
		e.Relation, strings.Join(e.Missing, ", "))
}

// ActionError is a token whose action is none the tailer knows (a value
// added to the token_action type). It is not a bad row: every token of
// that action would be one, so the stream stops at the first, unconfirmed.
type ActionError struct {
	Label string
}

func (e *ActionError) Error() string {
	return fmt.Sprintf("a token's action %q is no token action this tailer knows (%s)", e.Label, strings.Join(action.Labels(), ", "))
}

// Decode handles one pgoutput message (the payload of an XLogData message).
func (d *Decoder) Decode(msg []byte, sink Output) error {
	if len(msg) == 0 {
		return fmt.Errorf("%w: empty message", ErrProtocol)
	}
	// A transaction still being handed over comes first: rows must reach
	// the sink in commit order.
	for d.handing != nil {
		if _, err := d.Continue(sink); err != nil {
			return err
		}
	}
	r := reader{buf: msg[1:]}
	switch msg[0] {
	case 'B':
		return d.begin(&r)
	case 'C':
		return d.commit(&r, sink)
	case 'R':
		return d.relation(&r)
	case 'I':
		return d.insert(&r, sink)
	case 'S':
		return d.streamStart(&r)
	case 'E':
		d.inStream = false
		return nil
	case 'c':
		return d.streamCommit(&r, sink)
	case 'A':
		return d.streamAbort(&r)
	case 'M':
		return d.message(&r, sink)
	case 'O', 'Y', 'U', 'D', 'T':
		// Origins, types, updates, deletes and truncates carry no token
		// inserts.
		return nil
	}
	return fmt.Errorf("%w: unexpected message type %q", ErrProtocol, msg[0])
}

// Pending reports how many streamed transactions are buffered, waiting for
// their Stream Commit or Stream Abort.
func (d *Decoder) Pending() int { return len(d.streams) }

// PartlyHandedOver reports whether a committed streamed transaction is
// only partly handed over (see HandoverChunk); call Continue to go on.
func (d *Decoder) PartlyHandedOver() bool { return d.handing != nil }

// Continue hands the next HandoverChunk rows of a committed streamed
// transaction to sink, and its commit after the last row. It reports whether
// the transaction is now fully handed over.
func (d *Decoder) Continue(sink Output) (bool, error) {
	if d.handing == nil {
		return true, nil
	}
	chunk := d.HandoverChunk
	if chunk <= 0 {
		chunk = int(^uint(0) >> 1)
	}
	done, err := d.handing.step(sink, chunk)
	if err != nil {
		d.handing.tx.close()
		d.handing = nil
		return false, err
	}
	if done {
		d.handing = nil
	}
	return done, nil
}

// Close releases the files of buffered streamed transactions.
func (d *Decoder) Close() {
	for xid, st := range d.streams {
		st.close()
		delete(d.streams, xid)
	}
	if d.handing != nil {
		d.handing.tx.close()
		d.handing = nil
	}
}

func (d *Decoder) begin(r *reader) error {
	finalLSN := r.u64()
	commitTime := int64(r.u64())
	xid := r.u32()
	if r.err != nil {
		return r.fail("begin")
	}
	if d.inTx || d.inStream {
		return fmt.Errorf("%w: begin inside a transaction or a streamed chunk", ErrProtocol)
	}
	d.inTx, d.txCommit, d.txXid, d.txTime, d.txIndex, d.txTrace = true, pglogrepl.LSN(finalLSN), xid, commitTime, 0, ""
	return nil
}

func (d *Decoder) commit(r *reader, sink Output) error {
	r.u8() // flags
	commitLSN := r.u64()
	endLSN := r.u64()
	commitTime := int64(r.u64())
	if r.err != nil {
		return r.fail("commit")
	}
	if !d.inTx || pglogrepl.LSN(commitLSN) != d.txCommit {
		// Rows were positioned by the Begin's final LSN.
		return fmt.Errorf("%w: commit at %s does not end the transaction begun for %s", ErrProtocol, pglogrepl.LSN(commitLSN), d.txCommit)
	}
	d.inTx = false
	sink.Commit(pglogrepl.LSN(commitLSN), pglogrepl.LSN(endLSN), pgTime(commitTime))
	return nil
}

func (d *Decoder) streamStart(r *reader) error {
	xid := r.u32()
	r.u8() // first segment
	if r.err != nil {
		return r.fail("stream start")
	}
	if d.inTx {
		return fmt.Errorf("%w: stream start inside a transaction", ErrProtocol)
	}
	d.inStream, d.streamXid = true, xid
	if d.streams[xid] == nil {
		d.streams[xid] = &streamedTx{}
	}
	return nil
}

func (d *Decoder) streamCommit(r *reader, sink Output) error {
	xid := r.u32()
	r.u8() // flags
	commitLSN := pglogrepl.LSN(r.u64())
	endLSN := pglogrepl.LSN(r.u64())
	commitTime := int64(r.u64())
	if r.err != nil {
		return r.fail("stream commit")
	}
	if d.inTx || d.inStream {
		return fmt.Errorf("%w: stream commit inside a transaction or a streamed chunk", ErrProtocol)
	}
	st := d.streams[xid]
	delete(d.streams, xid)
	if st == nil {
		st = &streamedTx{}
	}
	h := &handover{tx: st, xid: xid, commitLSN: commitLSN, endLSN: endLSN, commitTime: commitTime}
	if err := h.start(); err != nil {
		st.close()
		return err
	}
	d.handing = h
	_, err := d.Continue(sink)
	return err
}

func (d *Decoder) streamAbort(r *reader) error {
	xid := r.u32()
	subXid := r.u32()
	// Protocol v4 appends the abort LSN and timestamp; they are not needed.
	if r.err != nil {
		return r.fail("stream abort")
	}
	st := d.streams[xid]
	if st == nil {
		return nil
	}
	if subXid == xid {
		st.close()
		delete(d.streams, xid)
		return nil
	}
	if st.aborted == nil {
		st.aborted = make(map[uint32]struct{})
	}
	st.aborted[subXid] = struct{}{}
	return nil
}

func (d *Decoder) relation(r *reader) error {
	if d.inStream {
		r.u32() // xid
	}
	id := r.u32()
	ns := r.cstring()
	name := r.cstring()
	r.u8() // replica identity
	ncols := int(r.u16())
	rel := &relation{
		isTokens: string(ns) == d.schema && string(name) == d.table,
		ncols:    ncols,
		colID:    -1, colAction: -1, colSecret: -1, colCode: -1, colAccount: -1,
	}
	for i := 0; i < ncols && r.err == nil; i++ {
		r.u8() // flags
		col := r.cstring()
		r.u32() // type oid
		r.u32() // type modifier
		switch string(col) {
		case "id":
			rel.colID = i
		case "action":
			rel.colAction = i
		case "secret":
			rel.colSecret = i
		case "code":
			rel.colCode = i
		case "account":
			rel.colAccount = i
		}
	}
	if r.err != nil {
		return r.fail("relation")
	}
	if rel.isTokens {
		for _, c := range [...]struct {
			name string
			at   int
		}{{"id", rel.colID}, {"action", rel.colAction}, {"secret", rel.colSecret}, {"code", rel.colCode}, {"account", rel.colAccount}} {
			if c.at < 0 {
				rel.missing = append(rel.missing, c.name)
			}
		}
	}
	d.relations[id] = rel
	return nil
}

func (d *Decoder) insert(r *reader, sink Output) error {
	var xid uint32
	if d.inStream {
		xid = r.u32()
	}
	relID := r.u32()
	if kind := r.u8(); r.err == nil && kind != 'N' {
		return fmt.Errorf("%w: insert: tuple kind %q, want 'N'", ErrProtocol, kind)
	}
	if r.err != nil {
		return r.fail("insert")
	}
	rel := d.relations[relID]
	if rel == nil {
		return fmt.Errorf("%w: insert into relation %d before its Relation message", ErrProtocol, relID)
	}
	if !rel.isTokens {
		return nil
	}
	if rel.missing != nil {
		return &RelationError{Relation: d.schema + "." + d.table, Missing: rel.missing}
	}

	tok := &d.tok
	*tok = Token{}
	rowErr, err := rel.decodeTuple(r, tok)
	if err != nil {
		return err
	}

	if d.inStream {
		st := d.streams[d.streamXid]
		if st == nil {
			return fmt.Errorf("%w: insert for streamed transaction %d after its Stream Abort", ErrProtocol, d.streamXid)
		}
		return st.add(d.SpillDir, d.memRows, &streamedRow{subXid: xid, tok: *tok, err: rowErr})
	}
	if !d.inTx {
		return fmt.Errorf("%w: insert outside a transaction", ErrProtocol)
	}
	pos := wal.Position{Commit: wal.LSN(d.txCommit), Index: d.txIndex}
	d.txIndex++
	if rowErr != nil {
		sink.BadRow(pos, rowErr)
		return nil
	}
	tok.Pos, tok.Xid, tok.CommitTime, tok.Trace = pos, d.txXid, d.txTime, d.txTrace
	sink.Token(tok)
	return nil
}
