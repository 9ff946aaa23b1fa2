package replication

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/internal/pgname"
)

// Record is what the database says about a slot the tailer owns (table
// tailer_slot): which incarnation of the slot exists, and which of the
// stream's batches belong to it.
//
// Every time a tailer command creates the slot it records a new
// incarnation, and every batch published from the slot carries it. The
// record is copied with the database but the slot is not (pg_basebackup and
// dumps leave slots out), so a copy or a restore can only stream from a slot
// made after the copy, under a new incarnation: the stream's batches of the
// original never pass for its own.
type Record struct {
	Slot string
	// Exists is false when no tailer command recorded the slot.
	Exists      bool
	Incarnation string
	CreatedBy   string
	CreatedAt   time.Time
	// ResyncPending: a resync created this incarnation and has not
	// published all of its snapshot yet.
	ResyncPending bool
	// ResyncNeeded: the publication could not carry token inserts while
	// this incarnation's slot existed (SetResyncNeeded), so the slot's
	// stream lacks them for good.
	ResyncNeeded    bool
	ConsistentPoint pglogrepl.LSN
	// Bound says StreamSeq is known: the stream's last sequence when this
	// incarnation took the stream over. Messages up to it belong to
	// earlier incarnations; later ones must be this one's.
	Bound     bool
	StreamSeq uint64
	// Legacy: the slot predates incarnations, so its batches without one
	// are its own.
	Legacy bool
	// Cutover is set once mailroom's collector's database was adopted.
	Cutover *Cutover
	// Blocked says why tailer run waits for the operator, since
	// BlockedAt; empty while it can stream.
	Blocked   string
	BlockedAt time.Time
	// StreamName is the stream the incarnation publishes to, and
	// StreamCreated when the NATS server created it (SetStream); empty
	// until a tailer recorded them.
	StreamName, StreamCreated string
	// StoppedSeq and StoppedMsgID are the stream's last sequence and that
	// message's mark when tailer run last stopped cleanly (SetStopped);
	// zero and empty once a session has started since.
	StoppedSeq   uint64
	StoppedMsgID string
	// AnchorSeq and AnchorMark are the newest batch of the incarnation a
	// tailer found on the stream StreamName, at its sequence (SetAnchor):
	// what a tailer started after another was killed checks the stream
	// by. Zero and empty until one is recorded, and after a resync.
	AnchorSeq  uint64
	AnchorMark string
	// Seen is what the stream held when the anchor was recorded (SetAnchor,
	// FinishResync); nil until a tailer of the incarnation looked.
	Seen *StreamSeen
	// RefusedFact and Refused are a refusal that lasts until a resync
	// (SetRefused): the fact (publish/relay's name of it) and the
	// words it was said with, since RefusedAt; empty while there is none.
	RefusedFact, Refused string
	RefusedAt            time.Time
	// ResyncCause says why the publication guard marked the slot for a
	// resync, when it was not the publication (a table attached to tokens
	// holding rows); empty otherwise.
	ResyncCause string
	// ConfirmLimit is the furthest position a tailer of the incarnation
	// may have confirmed to the slot (Lease.SetConfirmLimit, written before
	// it confirms past it); zero until one was written. The slot confirmed
	// further was advanced by another process.
	ConfirmLimit pglogrepl.LSN
	// HealAsked: a tailer audit --heal asked for the lease within the
	// last minute (AskHeal). AuditMissing are the ids (the first
	// thousand, comma-separated) of the AuditMissingCount tokens an audit
	// found missing from the stream, not healed or acknowledged since
	// AuditMissingAt ("" and 0: none). AuditThrough is how far tailer
	// run's audit got: the tokens created before it are audited (zero:
	// none yet).
	HealAsked         bool
	AuditMissing      string
	AuditMissingCount int64
	AuditMissingAt    time.Time
	AuditThrough      time.Time
}

// StreamSeen is what a stream held when a tailer looked at it: its first
// and last sequences, how many messages within them were gone and how
// many were batches, whether its configuration removed old messages then,
// and whether nothing of the tailer's was on its way (a clean stop).
type StreamSeen struct {
	First, Last  uint64
	Deleted      int
	Batches      uint64
	Trims, Quiet bool
	Keeps        uint64
}

// Cutover is where mailroom's collector stopped: it sent the tokens up to
// LastSeq (jobs.last_seq) that were created before At (epoch seconds).
// After TRUNCATE ... RESTART IDENTITY new tokens reuse those ids, which is
// why the time is part of it.
type Cutover struct {
	LastSeq int64
	At      int64
}

// ErrNoRecordTable is returned when the database lacks tailer_slot: its
// schema predates this tailer.
var ErrNoRecordTable = errors.New("table tailer_slot does not exist: run `tailer migrate` (the schema is older than this tailer)")

// ErrOldRecordTable is returned when tailer_slot lacks a column this
// tailer reads: the schema predates it.
var ErrOldRecordTable = errors.New("table tailer_slot lacks columns this tailer reads: run `tailer migrate` (the schema is older than this tailer)")

// ErrOldSchema is returned when the database lacks a table column or
// function of the tailer's schema that this tailer uses.
var ErrOldSchema = errors.New("the database's tailer schema is older than this tailer: run `tailer migrate`")

// NewIncarnation returns a fresh incarnation id.
func NewIncarnation() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

const recordColumns = `incarnation, created_by, created_at, resync_pending, resync_needed, consistent_point::text, stream_seq, legacy, collector_last_seq, collector_cutover,
	coalesce(blocked, ''), coalesce(blocked_at, 'epoch'), coalesce(stream_name, ''), coalesce(stream_created, ''),
	coalesce(stopped_seq, 0), coalesce(stopped_msg_id, ''), coalesce(anchor_seq, 0), coalesce(anchor_mark, ''),
	coalesce(refused_fact, ''), coalesce(refused, ''), coalesce(refused_at, 'epoch'), seen_first, seen_last, seen_deleted,
	coalesce(resync_cause, ''), confirm_limit::text, coalesce(seen_batches, 0), coalesce(seen_trims, false), coalesce(seen_quiet, false), coalesce(seen_keeps, 0),
	coalesce(heal_asked_at > now() - interval '1 minute', false), coalesce(audit_missing, ''), coalesce(audit_missing_at, 'epoch'),
	coalesce(audit_missing_count, 0), audit_through`

// LoadRecord reads slot's record; Exists is false when there is none.
func LoadRecord(ctx context.Context, db SchemaConn, slot string) (Record, error) {
	r := Record{Slot: slot}
	var (
		cp         *string
		seq        *int64
		lastSeq    *int64
		cutoverAt  *int64
		stoppedSeq int64
		anchorSeq  int64
		seen       [3]*int64
		limit      *string
		seenKind   StreamSeen
		through    *time.Time
	)
	err := db.QueryRow(ctx, `SELECT `+recordColumns+` FROM `+db.slots()+` WHERE slot = $1`, slot).
		Scan(&r.Incarnation, &r.CreatedBy, &r.CreatedAt, &r.ResyncPending, &r.ResyncNeeded, &cp, &seq, &r.Legacy, &lastSeq, &cutoverAt, &r.Blocked, &r.BlockedAt,
			&r.StreamName, &r.StreamCreated, &stoppedSeq, &r.StoppedMsgID, &anchorSeq, &r.AnchorMark, &r.RefusedFact, &r.Refused, &r.RefusedAt,
			&seen[0], &seen[1], &seen[2], &r.ResyncCause, &limit, &seenKind.Batches, &seenKind.Trims, &seenKind.Quiet, &seenKind.Keeps,
			&r.HealAsked, &r.AuditMissing, &r.AuditMissingAt, &r.AuditMissingCount, &through)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return r, nil
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable:
		return r, ErrNoRecordTable
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedColumn:
		return r, ErrOldRecordTable
	case err != nil:
		return r, fmt.Errorf("read the record of slot %s: %w", slot, err)
	}
	r.Exists = true
	r.StoppedSeq, r.AnchorSeq = uint64(stoppedSeq), uint64(anchorSeq)
	if seen[0] != nil && seen[1] != nil && seen[2] != nil {
		r.Seen = &StreamSeen{First: uint64(*seen[0]), Last: uint64(*seen[1]), Deleted: int(*seen[2]),
			Batches: seenKind.Batches, Trims: seenKind.Trims, Quiet: seenKind.Quiet, Keeps: seenKind.Keeps}
	}
	if through != nil {
		r.AuditThrough = *through
	}
	if cp != nil {
		if r.ConsistentPoint, err = pglogrepl.ParseLSN(*cp); err != nil {
			return r, fmt.Errorf("record of slot %s: consistent point: %w", slot, err)
		}
	}
	if limit != nil {
		if r.ConfirmLimit, err = pglogrepl.ParseLSN(*limit); err != nil {
			return r, fmt.Errorf("record of slot %s: confirm limit: %w", slot, err)
		}
	}
	if seq != nil {
		r.Bound, r.StreamSeq = true, uint64(*seq)
	}
	if lastSeq != nil && cutoverAt != nil {
		r.Cutover = &Cutover{LastSeq: *lastSeq, At: *cutoverAt}
	}
	return r, nil
}

// Describe names the incarnation for messages: who made it, and when.
func (r Record) Describe() string {
	return fmt.Sprintf("incarnation %s, created by %s at %s", r.Incarnation, r.CreatedBy, r.CreatedAt.UTC().Format(time.RFC3339))
}

// saveRecord writes r as slot's record under a new incarnation, keeping
// the collector's cutover unless r sets one. The caller holds the lease.
func saveRecord(ctx context.Context, db SchemaConn, r *Record) error {
	r.Incarnation = NewIncarnation()
	var seq, lastSeq, cutoverAt *int64
	if r.Bound {
		s := int64(r.StreamSeq)
		seq = &s
	}
	if r.Cutover != nil {
		lastSeq, cutoverAt = &r.Cutover.LastSeq, &r.Cutover.At
	}
	var cp, limit *string
	if r.ConsistentPoint != 0 {
		s := r.ConsistentPoint.String()
		cp = &s
	}
	if r.ConfirmLimit != 0 {
		s := r.ConfirmLimit.String()
		limit = &s
	}
	err := db.QueryRow(ctx, `
		INSERT INTO `+db.slots()+` AS s (slot, incarnation, created_by, created_at, resync_pending, consistent_point, stream_seq, legacy, collector_last_seq, collector_cutover, confirm_limit)
		VALUES ($1, $2, $3, now(), $4, $5::pg_lsn, $6, false, $7, $8, $9::pg_lsn)
		ON CONFLICT (slot) DO UPDATE SET incarnation = EXCLUDED.incarnation, created_by = EXCLUDED.created_by,
			created_at = EXCLUDED.created_at, resync_pending = EXCLUDED.resync_pending, consistent_point = EXCLUDED.consistent_point,
			stream_seq = EXCLUDED.stream_seq, legacy = false, resync_needed = false, resync_cause = NULL, blocked = NULL, blocked_at = NULL,
			confirm_limit = EXCLUDED.confirm_limit,
			stopped_seq = NULL, stopped_msg_id = NULL, anchor_seq = NULL, anchor_mark = NULL,
			seen_first = NULL, seen_last = NULL, seen_deleted = NULL, seen_batches = NULL, seen_trims = NULL, seen_quiet = NULL, seen_keeps = NULL,
			refused_fact = NULL, refused = NULL, refused_at = NULL,
			collector_last_seq = coalesce(EXCLUDED.collector_last_seq, s.collector_last_seq),
			collector_cutover = coalesce(EXCLUDED.collector_cutover, s.collector_cutover)
		RETURNING created_at, collector_last_seq, collector_cutover`,
		r.Slot, r.Incarnation, r.CreatedBy, r.ResyncPending, cp, seq, lastSeq, cutoverAt, limit).Scan(&r.CreatedAt, &lastSeq, &cutoverAt)
	if err != nil {
		return fmt.Errorf("record slot %s (has `tailer migrate` run?): %w", r.Slot, err)
	}
	r.Exists, r.Legacy, r.StoppedSeq, r.StoppedMsgID = true, false, 0, ""
	r.AnchorSeq, r.AnchorMark, r.Seen = 0, "", nil
	r.RefusedFact, r.Refused, r.RefusedAt = "", "", time.Time{}
	r.ResyncNeeded, r.ResyncCause = false, ""
	if lastSeq != nil && cutoverAt != nil {
		r.Cutover = &Cutover{LastSeq: *lastSeq, At: *cutoverAt}
	}
	return nil
}

// CreateSlot creates the slot and records a new incarnation of it, made by
// by. bound says the stream is known to hold nothing of an earlier slot
// (it is empty), so the incarnation owns the stream from its start. The
// caller holds the lease.
func CreateSlot(ctx context.Context, db SchemaConn, slot, by string, bound, failover bool) (Record, error) {
	if err := ValidateName(slot); err != nil {
		return Record{}, fmt.Errorf("slot name: %w", err)
	}
	create := `pg_create_logical_replication_slot($1, $2)`
	if failover {
		// (name, plugin, temporary, twophase, failover): PostgreSQL 17+.
		create = `pg_create_logical_replication_slot($1, $2, false, false, true)`
	}
	var at string
	if err := db.QueryRow(ctx, `SELECT lsn::text FROM `+create, slot, Plugin).Scan(&at); err != nil {
		return Record{}, fmt.Errorf("create slot %s: %w", slot, err)
	}
	made, err := pglogrepl.ParseLSN(at)
	if err != nil {
		return Record{}, fmt.Errorf("create slot %s: its position: %w", slot, err)
	}
	// A crash between the two leaves a slot without a record, which tailer
	// run adopts only beside an empty stream, as it would bind this one.
	r := Record{Slot: slot, CreatedBy: by, Bound: bound, ConfirmLimit: made}
	return r, saveRecord(ctx, db, &r)
}

// AdoptSlot records a new incarnation for a slot that exists without a
// record (made by hand, or by an older tailer), beside an empty stream.
func AdoptSlot(ctx context.Context, db SchemaConn, slot string) (Record, error) {
	var at string
	if err := db.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, slot).Scan(&at); err != nil {
		return Record{}, fmt.Errorf("adopt slot %s: its position: %w", slot, err)
	}
	confirmed, err := pglogrepl.ParseLSN(at)
	if err != nil {
		return Record{}, fmt.Errorf("adopt slot %s: its position: %w", slot, err)
	}
	r := Record{Slot: slot, CreatedBy: "adopted by tailer run", Bound: true, ConfirmLimit: confirmed}
	return r, saveRecord(ctx, db, &r)
}

// BeginResync records that a resync is about to recreate the slot: a new
// incarnation, pending until FinishResync. It is written before the old
// slot is dropped, so that a resync that dies half way leaves a record
// that says so. cutover, when set, is the collector's being adopted.
func BeginResync(ctx context.Context, db SchemaConn, slot, by string, cutover *Cutover) (Record, error) {
	r := Record{Slot: slot, CreatedBy: by, ResyncPending: true, Cutover: cutover}
	return r, saveRecord(ctx, db, &r)
}

// FinishResync marks the resync of incarnation done: every token of its
// snapshot is on stream, whose last sequence is now streamSeq, that
// message's mark lastMark (publish/wire.Mark), and which holds what seen
// says. It fails when the record
// names another incarnation: a resync that lost its lease has been
// superseded, and must not say the slot is ready.
func FinishResync(ctx context.Context, db SchemaConn, r *Record, cp pglogrepl.LSN, stream StreamIdentity, streamSeq uint64, lastMark string, seen StreamSeen) error {
	tag, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET resync_pending = false, consistent_point = $3::pg_lsn, confirm_limit = $3::pg_lsn, stream_seq = $4, stream_name = $5, stream_created = $6,
			anchor_seq = nullif($7, 0), anchor_mark = nullif($8, ''), seen_first = $9, seen_last = $10, seen_deleted = $11,
			seen_batches = $12, seen_trims = $13, seen_quiet = $14, seen_keeps = $15
		WHERE slot = $1 AND incarnation = $2 AND resync_pending`, r.Slot, r.Incarnation, cp.String(), int64(streamSeq), stream.Name, stream.Created,
		int64(streamSeq), lastMark, int64(seen.First), int64(seen.Last), int64(seen.Deleted), int64(seen.Batches), seen.Trims, seen.Quiet, int64(seen.Keeps))
	if err != nil {
		return fmt.Errorf("record the end of the resync of slot %s: %w", r.Slot, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("record the end of the resync of slot %s: its record no longer names incarnation %s: another resync took the slot over", r.Slot, r.Incarnation)
	}
	r.ResyncPending, r.ConsistentPoint, r.ConfirmLimit, r.Bound, r.StreamSeq = false, cp, cp, true, streamSeq
	r.StreamName, r.StreamCreated = stream.Name, stream.Created
	r.AnchorSeq, r.AnchorMark, r.Seen = streamSeq, lastMark, &seen
	return nil
}

// StreamIdentity names a JetStream stream and when its server created it:
// a stream deleted and made again has the name, not the time.
type StreamIdentity struct {
	Name, Created string
}

// SetStream records the stream r's incarnation publishes to. The caller
// holds the lease.
func SetStream(ctx context.Context, db SchemaConn, r *Record, stream StreamIdentity) error {
	// An anchor, and what the stream held, name the stream they were found
	// on.
	_, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET stream_name = $3, stream_created = $4,
			anchor_seq = CASE WHEN stream_name = $3 THEN anchor_seq END, anchor_mark = CASE WHEN stream_name = $3 THEN anchor_mark END,
			seen_first = CASE WHEN stream_name = $3 THEN seen_first END, seen_last = CASE WHEN stream_name = $3 THEN seen_last END,
			seen_deleted = CASE WHEN stream_name = $3 THEN seen_deleted END, seen_batches = CASE WHEN stream_name = $3 THEN seen_batches END,
			seen_trims = CASE WHEN stream_name = $3 THEN seen_trims END, seen_quiet = CASE WHEN stream_name = $3 THEN seen_quiet END,
			seen_keeps = CASE WHEN stream_name = $3 THEN seen_keeps END
		WHERE slot = $1 AND incarnation = $2`,
		r.Slot, r.Incarnation, stream.Name, stream.Created)
	if err != nil {
		return fmt.Errorf("record slot %s's stream: %w", r.Slot, err)
	}
	if r.StreamName != stream.Name {
		r.AnchorSeq, r.AnchorMark, r.Seen = 0, "", nil
	}
	r.StreamName, r.StreamCreated = stream.Name, stream.Created
	return nil
}

// SetAnchor records, for slot's incarnation, the newest batch it found on
// its stream, at seq with mark (an older anchor never replaces a newer
// one), and what the
// stream held then. A resync since (another incarnation) leaves the
// record as it is.
func SetAnchor(ctx context.Context, db SchemaConn, slot, incarnation string, seq uint64, mark string, seen StreamSeen) error {
	_, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET
			anchor_seq = CASE WHEN coalesce(anchor_seq, 0) < $3 THEN $3 ELSE anchor_seq END,
			anchor_mark = CASE WHEN coalesce(anchor_seq, 0) < $3 THEN $4 ELSE anchor_mark END,
			seen_first = $5, seen_last = $6, seen_deleted = $7, seen_batches = $8, seen_trims = $9, seen_quiet = $10, seen_keeps = $11
		WHERE slot = $1 AND incarnation = $2`, slot, incarnation, int64(seq), mark, int64(seen.First), int64(seen.Last), int64(seen.Deleted),
		int64(seen.Batches), seen.Trims, seen.Quiet, int64(seen.Keeps))
	if err != nil {
		return fmt.Errorf("record the newest batch slot %s found on its stream: %w", slot, err)
	}
	return nil
}

// Bind records that incarnation r owns the stream from streamSeq on (the
// stream's last sequence when it first looked, with nothing of an earlier
// slot on it).
func Bind(ctx context.Context, db SchemaConn, r *Record, streamSeq uint64) error {
	tag, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET stream_seq = $3 WHERE slot = $1 AND incarnation = $2 AND stream_seq IS NULL`,
		r.Slot, r.Incarnation, int64(streamSeq))
	if err != nil {
		return fmt.Errorf("record slot %s's start on the stream: %w", r.Slot, err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("record slot %s's start on the stream: its record changed meanwhile", r.Slot)
	}
	r.Bound, r.StreamSeq = true, streamSeq
	return nil
}

// SetResyncNeeded records that slot's stream lacks token inserts for
// good: the publication could not carry them while the slot existed.
// Only a resync's new incarnation clears it. Without a record there is
// nothing to mark: no tailer has streamed from the slot.
func SetResyncNeeded(ctx context.Context, db SchemaConn, slot string) error {
	_, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET resync_needed = true WHERE slot = $1 AND NOT resync_needed`, slot)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable:
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedColumn:
		return fmt.Errorf("record that slot %s needs a resync: %w", slot, ErrOldRecordTable)
	case err != nil:
		return fmt.Errorf("record that slot %s needs a resync: %w", slot, err)
	}
	return nil
}

// SetBlocked records why tailer run waits for the operator (empty: it no
// longer does), for tailer status. The caller holds the lease. A slot
// without a record has nowhere to say it: /readyz and the log still do.
func SetBlocked(ctx context.Context, db SchemaConn, slot, why string) error {
	_, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET blocked = nullif($2, ''), blocked_at = CASE WHEN $2 = '' THEN NULL ELSE now() END
		WHERE slot = $1 AND coalesce(blocked, '') <> $2`, slot, why)
	if err != nil {
		return fmt.Errorf("record why slot %s waits: %w", slot, err)
	}
	return nil
}

// SetStopped records where the stream stood when tailer run stopped
// cleanly: its last sequence and that message's mark (seq 0 clears it, as
// every session does at its start). The caller holds the lease.
func SetStopped(ctx context.Context, db SchemaConn, r *Record, seq uint64, mark string) error {
	var s *int64
	var m *string
	if seq != 0 {
		v := int64(seq)
		s, m = &v, &mark
	}
	if _, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET stopped_seq = $3, stopped_msg_id = $4 WHERE slot = $1 AND incarnation = $2`,
		r.Slot, r.Incarnation, s, m); err != nil {
		return fmt.Errorf("record where the stream stood for slot %s: %w", r.Slot, err)
	}
	r.StoppedSeq, r.StoppedMsgID = seq, mark
	return nil
}

// SetRefused records, for r's incarnation, a refusal that lasts until a
// resync (its fact's name and the words it was said with), unless one is
// recorded already: the first says what was found first. The caller
// holds the lease.
func SetRefused(ctx context.Context, db SchemaConn, r *Record, fact, said string) error {
	tag, err := db.Exec(ctx, `UPDATE `+db.slots()+` SET refused_fact = $3, refused = $4, refused_at = now()
		WHERE slot = $1 AND incarnation = $2 AND refused IS NULL`, r.Slot, r.Incarnation, fact, said)
	if err != nil {
		return fmt.Errorf("record that slot %s is refused until a resync: %w", r.Slot, err)
	}
	if tag.RowsAffected() == 1 {
		r.RefusedFact, r.Refused = fact, said
	}
	return nil
}

// SharedWith lists the other schemas of the database whose record
// (tailer_slot) names slot: the tailer of each would stream it through its
// own publication. Schemas whose record the role may not read are listed
// apart: whether they name it cannot be told.
func SharedWith(ctx context.Context, db SchemaConn, slot string) (shared, unreadable []string, err error) {
	var schemas []string
	err = db.QueryRow(ctx, `SELECT coalesce(array_agg(n.nspname::text ORDER BY n.nspname), '{}') FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = 'tailer_slot' AND c.relkind IN ('r', 'p') AND n.nspname <> $1`, string(db.Schema)).Scan(&schemas)
	if err != nil {
		return nil, nil, fmt.Errorf("look for other schemas' records of slot %s: %w", slot, err)
	}
	for _, s := range schemas {
		var named bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+pgname.Schema(s).Name("tailer_slot")+` WHERE slot = $1)`, slot).Scan(&named)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InsufficientPrivilege:
			unreadable = append(unreadable, s)
		case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedColumn:
			// An older schema's table: no slot column to name it by.
		case err != nil:
			return nil, nil, fmt.Errorf("read schema %s's record of slot %s: %w", s, slot, err)
		case named:
			shared = append(shared, s)
		}
	}
	return shared, unreadable, nil
}
