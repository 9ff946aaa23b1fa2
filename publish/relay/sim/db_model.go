package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/decoder/wal"

	"github.com/mailroom/tailer/publish/relay"
	"github.com/mailroom/tailer/publish/token"
)

// The simulation's model of the mailroom database as the relay sees it:
// the WAL's token transactions, the slot that replays them, the slot's
// record and the publication. TestSlotModelAgreesWithPostgreSQL holds the
// slot to a real server.

// simTok is a committed token: its key (token.AppendKey's, as
// messages carry it), its raw key and its place in the WAL.
type simTok struct {
	key string
	raw token.RawKey
	pos wal.Position
}

// newTok is the n-th token, at pos.
func newTok(n int, pos wal.Position) simTok {
	var secret [token.SecretSize]byte
	binary.BigEndian.PutUint64(secret[:], uint64(n))
	return simTok{key: string(token.AppendKey(nil, &secret)), raw: token.RawKeyOf(&secret), pos: pos}
}

// tx is a committed transaction of tokens. inSlot says the slot's stream
// carries it: a transaction committed while the publication could not
// carry token inserts is decoded without them, however often replayed.
type tx struct {
	commit wal.LSN
	toks   []simTok
	inSlot bool
}

// slotModel is the logical replication slot: from where it was made, and
// how far it is confirmed.
type slotModel struct {
	made, confirmed wal.LSN
	lost            bool
}

// dbModel is the database.
type dbModel struct {
	txs    []tx
	next   wal.LSN
	tokens *int
	slot   *slotModel
	rec    relay.SlotRecord
	// guarded: the publication guard marks the slot in the transaction of
	// a publication change; published: the record names the publication
	// (the guard only marks slots a tailer streamed from).
	broken, guarded, published bool
	origin                     relay.Origin
	incarnations               *int
}

func newDB(tokens, incarnations *int) *dbModel {
	return &dbModel{next: 0x100, tokens: tokens, incarnations: incarnations, guarded: true,
		origin: relay.Origin{SystemID: "7", Timeline: 1, Database: "mailroom"}}
}

// commit commits a transaction of n tokens.
func (db *dbModel) commit(n int) {
	db.next += 0x10
	t := tx{commit: db.next, inSlot: !db.broken}
	for i := range n {
		*db.tokens++
		t.toks = append(t.toks, newTok(*db.tokens, wal.Position{Commit: db.next, Index: uint32(i)}))
	}
	db.txs = append(db.txs, t)
}

// attach commits n tokens that enter tokens without an insert the slot
// carries (a table attached holding rows); the publication guard marks the
// slot in the attach's transaction, saying why.
func (db *dbModel) attach(n int) {
	broken := db.broken
	db.broken = true
	db.commit(n)
	db.broken = broken
	if db.guarded && db.published && db.rec.Exists {
		db.rec.ResyncNeeded, db.rec.ResyncCause = true, "a table was attached to tokens holding rows"
	}
}

// wal is the WAL's current position.
func (db *dbModel) wal() wal.LSN { return db.next }

// newIncarnation records a new incarnation of the slot.
func (db *dbModel) newIncarnation(bound bool, streamSeq uint64) {
	*db.incarnations++
	db.rec = relay.SlotRecord{Exists: true, Incarnation: fmt.Sprintf("i%d", *db.incarnations), Bound: bound, StreamSeq: streamSeq}
	if db.slot != nil {
		db.rec.ConfirmLimit = db.slot.confirmed
	}
}

// makeSlot makes the slot at the WAL's end.
func (db *dbModel) makeSlot() {
	db.slot = &slotModel{made: db.wal(), confirmed: db.wal()}
}

// replay is the slot's transactions past confirmed, as its stream
// carries them: none of a lost slot.
func (db *dbModel) replay(after wal.LSN) []tx {
	var out []tx
	for _, t := range db.txs {
		if t.commit > after && t.commit > db.slot.made {
			out = append(out, t)
		}
	}
	return out
}

// confirm moves the slot's confirmed position to lsn (never back).
func (db *dbModel) confirm(lsn wal.LSN) {
	if db.slot != nil && lsn > db.slot.confirmed {
		db.slot.confirmed = lsn
	}
}

// breakPublication makes the publication leave token inserts out; the
// guard marks the slot in the same transaction.
func (db *dbModel) breakPublication() {
	db.broken = true
	if db.guarded && db.published && db.rec.Exists {
		db.rec.ResyncNeeded = true
	}
}

// publicationErr is the publication check's finding.
func (db *dbModel) publicationErr() error {
	if db.broken {
		return errors.New("publication mailroom does not include the tokens table")
	}
	return nil
}

// clone is a snapshot of the database's files, the slot with them.
func (db *dbModel) clone() *dbModel {
	c := *db
	c.txs = append([]tx(nil), db.txs...)
	if db.slot != nil {
		s := *db.slot
		c.slot = &s
	}
	return &c
}

// failover promotes a standby that replayed all but the last lag
// transactions: the same system on its next timeline, whose history says
// where the old one ended, its WAL going on from there (new commits at
// the positions of those it lacked). A failover slot synchronized to it
// comes along, confirmed no further than the standby's WAL, if it was
// made before that (PostgreSQL 17+); without one it has no slot. The
// slot's record, a table's row, comes as last written.
func (db *dbModel) failover(lag int, synced bool) {
	lag = min(lag, len(db.txs))
	branch := db.next
	if lag > 0 {
		branch = db.txs[len(db.txs)-lag].commit - 0x10
		db.txs = db.txs[:len(db.txs)-lag]
	}
	o := db.origin
	o.History = map[int32]wal.LSN{o.Timeline: branch}
	for tl, end := range db.origin.History {
		o.History[tl] = end
	}
	o.Timeline++
	db.origin, db.next = o, branch
	switch {
	case db.slot == nil:
	case synced && db.slot.made <= branch:
		s := *db.slot
		s.confirmed = min(s.confirmed, branch)
		db.slot = &s
	default:
		db.slot = nil
	}
}

// eligible are the tokens a resync would publish, by key.
func (db *dbModel) eligible() map[string]bool {
	out := map[string]bool{}
	for _, t := range db.txs {
		for _, k := range t.toks {
			out[k.key] = true
		}
	}
	return out
}

// txEnd is the last transaction's commit (0: none).
func (db *dbModel) txEnd() wal.LSN {
	if len(db.txs) == 0 {
		return 0
	}
	return db.txs[len(db.txs)-1].commit
}
