package decoder

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/mailroom/tailer/publish/token"
)

// Output receives what the decoder finds, in commit order. The decoder calls
// it synchronously; a *Token is only valid for the duration of the call.
type Output interface {
	// Token is called for every well-formed insert into the tokens table.
	Token(t *Token)
	// BadRow is called for an insert into the tokens table that cannot be
	// turned into a Token. The row still occupies its position.
	BadRow(pos Position, err error)
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
	return fmt.Sprintf("a token's action %q is no token action this tailer knows (%s)", e.Label, strings.Join(token.Labels(), ", "))
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
	pos := Position{Commit: d.txCommit, Index: d.txIndex}
	d.txIndex++
	if rowErr != nil {
		sink.BadRow(pos, rowErr)
		return nil
	}
	tok.Pos, tok.Xid, tok.CommitTime, tok.Trace = pos, d.txXid, d.txTime, d.txTrace
	sink.Token(tok)
	return nil
}

// decodeTuple fills tok from a TupleData. It returns a row error for values
// that cannot form a token and a protocol error when the tuple itself is
// malformed.
func (rel *relation) decodeTuple(r *reader, tok *Token) (rowErr, err error) {
	n := int(r.u16())
	if r.err != nil {
		return nil, r.fail("tuple")
	}
	var seen [5]bool // id, action, secret, code, account
	for i := 0; i < n; i++ {
		kind := r.u8()
		var val []byte
		switch kind {
		case 'n', 'u':
		case 't', 'b':
			val = r.bytes(int(r.u32()))
		default:
			if r.err == nil {
				return nil, fmt.Errorf("%w: tuple column %d: kind %q", ErrProtocol, i, kind)
			}
		}
		if r.err != nil {
			return nil, r.fail("tuple")
		}
		if rowErr != nil {
			continue
		}
		binaryFmt := kind == 'b'
		null := kind != 't' && kind != 'b'
		switch i {
		case rel.colID:
			seen[0] = true
			tok.ID, rowErr = intValue("id", val, null, binaryFmt)
		case rel.colAction:
			seen[1] = true
			if null {
				rowErr = errors.New("action is NULL")
			} else if a, ok := token.ActionOf(val); ok {
				tok.Action = a
			} else {
				// No row to skip: every token of the action would be.
				return nil, &ActionError{Label: string(val)}
			}
		case rel.colSecret:
			seen[2] = true
			rowErr = secretValue(&tok.Secret, val, null, binaryFmt)
		case rel.colCode:
			seen[3] = true
			if null {
				tok.CodeNull = true
			} else if len(val) > len(tok.Code) {
				rowErr = fmt.Errorf("code is %d bytes, want at most %d", len(val), len(tok.Code))
			} else {
				tok.CodeLen = uint8(copy(tok.Code[:], val))
			}
		case rel.colAccount:
			seen[4] = true
			tok.Account, rowErr = intValue("account", val, null, binaryFmt)
		}
	}
	if rowErr != nil {
		return withID(rowErr, seen[0], tok.ID), nil
	}
	for i, name := range [...]string{"id", "action", "secret", "code", "account"} {
		if !seen[i] {
			return fmt.Errorf("column %s missing from the tokens relation", name), nil
		}
	}
	if spec, _ := tok.Action.Spec(); spec.CodeLen > 0 && (tok.CodeNull || int(tok.CodeLen) != spec.CodeLen) {
		if tok.CodeNull {
			return withID(fmt.Errorf("%s token has a NULL code", spec.Label), true, tok.ID), nil
		}
		return withID(fmt.Errorf("%s token code is %d bytes, want %d", spec.Label, tok.CodeLen, spec.CodeLen), true, tok.ID), nil
	}
	return nil, nil
}

// withID names the token of a row error by its id, when the id was
// decoded: the operator finds the row by it (a log line that named only
// its WAL position sent them to pg_waldump). It is part of the message,
// which a transaction spilled to disk keeps.
func withID(err error, decoded bool, id int64) error {
	if !decoded {
		return err
	}
	return fmt.Errorf("token id %d: %w", id, err)
}

// intValue reads an integer column of any width (smallint, integer or
// bigint), so that changing a column's width does not stop the tailer.
func intValue(col string, val []byte, null, binaryFmt bool) (int64, error) {
	if null {
		return 0, fmt.Errorf("%s is NULL", col)
	}
	if binaryFmt {
		switch len(val) {
		case 8:
			return int64(binary.BigEndian.Uint64(val)), nil
		case 4:
			return int64(int32(binary.BigEndian.Uint32(val))), nil
		case 2:
			return int64(int16(binary.BigEndian.Uint16(val))), nil
		}
		return 0, fmt.Errorf("%s: binary integer of %d bytes", col, len(val))
	}
	v, ok := atoi(val)
	if !ok {
		return 0, fmt.Errorf("%s: %q is not an integer", col, val)
	}
	return v, nil
}

func secretValue(dst *[32]byte, val []byte, null, binaryFmt bool) error {
	if null {
		return errors.New("secret is NULL")
	}
	if binaryFmt {
		if len(val) != len(dst) {
			return fmt.Errorf("secret is %d bytes, want %d", len(val), len(dst))
		}
		copy(dst[:], val)
		return nil
	}
	// Text format is bytea's hex output: \x followed by two digits a byte.
	if len(val) < 2 || val[0] != '\\' || val[1] != 'x' {
		return errors.New("secret is not in bytea hex format (bytea_output must be hex)")
	}
	hex := val[2:]
	if len(hex) != 2*len(dst) {
		return fmt.Errorf("secret is %d bytes, want %d", len(hex)/2, len(dst))
	}
	for i := range dst {
		hi, ok1 := unhex(hex[2*i])
		lo, ok2 := unhex(hex[2*i+1])
		if !ok1 || !ok2 {
			return errors.New("secret has a non-hex digit")
		}
		dst[i] = hi<<4 | lo
	}
	return nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// atoi parses a decimal int64 without allocating.
func atoi(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
		if len(b) == 0 {
			return 0, false
		}
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		next := v*10 + uint64(c-'0')
		if next < v || next > 1<<63 {
			return 0, false
		}
		v = next
	}
	if !neg && v > 1<<63-1 {
		return 0, false
	}
	if neg {
		return -int64(v), true
	}
	return int64(v), true
}

// reader reads big-endian pgoutput fields; the first short read sets err and
// makes every later read return zero values.
type reader struct {
	buf []byte
	err error
}

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.buf) < n {
		r.err = errShort
		return false
	}
	return true
}

var errShort = errors.New("message too short")

func (r *reader) u8() byte {
	if !r.need(1) {
		return 0
	}
	v := r.buf[0]
	r.buf = r.buf[1:]
	return v
}

func (r *reader) u16() uint16 {
	if !r.need(2) {
		return 0
	}
	v := binary.BigEndian.Uint16(r.buf)
	r.buf = r.buf[2:]
	return v
}

func (r *reader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.buf)
	r.buf = r.buf[4:]
	return v
}

func (r *reader) u64() uint64 {
	if !r.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(r.buf)
	r.buf = r.buf[8:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if !r.need(n) {
		return nil
	}
	v := r.buf[:n:n]
	r.buf = r.buf[n:]
	return v
}

func (r *reader) cstring() []byte {
	if r.err != nil {
		return nil
	}
	for i, c := range r.buf {
		if c == 0 {
			v := r.buf[:i:i]
			r.buf = r.buf[i+1:]
			return v
		}
	}
	r.err = errors.New("unterminated string")
	return nil
}

func (r *reader) fail(what string) error {
	return fmt.Errorf("%w: %s: %v", ErrProtocol, what, r.err)
}
