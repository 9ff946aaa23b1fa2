package resync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/relay"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/batch"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/decoder/action"
	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
)

// Options configure a resync.
type Options struct {
	DatabaseURL string
	// Schema holds the tokens and accounts tables and the slot's record.
	Schema pgname.Schema
	Slot   string
	// Publication must carry the tokens table's inserts to the new slot.
	Publication string
	// Destination is where tokens are published; its Origin is set by Run.
	Destination publish.Destination
	Signer      *token.Signer
	Format      wire.Format
	BatchLimit  int
	MaxInFlight int
	MaxBatches  int
	// By names what recreates the slot, for its record (tailer status).
	By string
	// Failover is MAILROOM_SLOT_FAILOVER (replication.FailoverAuto, On,
	// Off): whether the new slot is a failover slot.
	Failover string
	// Cutover, when set, adopts mailroom's collector's database: the
	// tokens it sent are never published. It is kept with the slot's
	// record, so later resyncs leave them out too.
	Cutover *replication.Cutover
	// ClockSkew is how far the database's and NATS's clocks may disagree;
	// the stream is read from the oldest candidate's creation less this.
	ClockSkew time.Duration
	Log       *slog.Logger
}

// Report says what a resync did.
type Report struct {
	Slot            string
	Incarnation     string
	ConsistentPoint pglogrepl.LSN
	Cutover         *replication.Cutover
	// Eligible tokens in the snapshot; OnStream of them were already
	// published, Published were published now, Unsafe were not
	// (unsafe_field, line format), Skipped were not for another reason
	// the join found (a row that cannot be signed, say).
	Eligible, OnStream, Published, Unsafe, Skipped int
	// Expired counts tokens that expired without being published: not
	// consumed, created after the stream's last message (or ever, for an
	// empty stream), expired by the time of the snapshot.
	Expired int
	// Messages published, and the stream's last sequence afterwards.
	Messages  int
	StreamSeq uint64
	// SetAside counts the messages read on the stream that are not the
	// tailer's batches (another publisher's): passed over, their content
	// not taken for tokens on the stream.
	SetAside int
}

// notSent leaves out the tokens mailroom's collector sent before the
// cutover ($1 its last_seq, $2 the cutover's epoch; both NULL without one).
const notSent = `($1::bigint IS NULL OR NOT (t.id <= $1::bigint AND t.created_at <= $2::bigint))`

// Run recreates opts.Slot from a snapshot and publishes through nc what the
// stream lacks. The caller holds the slot's lease; Run gives up when it is
// lost. A slot that some process streams from is refused before anything
// changes.
func Run(ctx context.Context, lease *replication.Lease, nc *nats.Conn, opts Options) (Report, error) {
	rep := Report{Slot: opts.Slot}
	if opts.BatchLimit <= 0 {
		opts.BatchLimit = 10
	}
	if opts.ClockSkew <= 0 {
		opts.ClockSkew = 5 * time.Minute
	}
	ctx, cancel := whileHeld(ctx, lease)
	defer cancel(nil)

	q, err := replication.Open(ctx, opts.DatabaseURL, "tailer resync", nil)
	if err != nil {
		return rep, err
	}
	defer q.Close(context.Background())
	db := replication.SchemaConn{Querier: q, Schema: opts.Schema}
	rec, failover, err := begin(ctx, q, db, opts, &rep)
	if err != nil {
		return rep, err
	}
	s, err := openSnapshot(ctx, q, opts, failover)
	if err != nil {
		return rep, err
	}
	defer s.close()
	rep.ConsistentPoint = s.snap.ConsistentPoint

	dest := opts.Destination
	dest.Origin = s.origin
	pub, err := publish.NewPublisher(ctx, nc, dest)
	if err != nil {
		return rep, err
	}
	defer pub.Close()
	// The new incarnation takes the stream over after its last message:
	// what is on it now says nothing about the new slot's positions. Its
	// markers keep out what an earlier session may still have on its way.
	inFlight := cmp.Or(opts.MaxInFlight, publish.InFlightFor(pub.Replicas()))
	if err := pub.Resume(ctx, relay.Owner{Origin: dest.Origin, Incarnation: rec.Incarnation, Since: pub.LastSeq(), InFlight: inFlight}); err != nil {
		return rep, err
	}
	var lastSeq, cutoverAt *int64
	if rep.Cutover != nil {
		lastSeq, cutoverAt = &rep.Cutover.LastSeq, &rep.Cutover.At
	}
	onStream, err := countTokens(ctx, s.tx, pub, opts, lastSeq, cutoverAt, &rep)
	if err != nil {
		return rep, err
	}
	if err := publishSnapshot(ctx, s.tx, s.jtx, pub, nc, opts, inFlight, s.snap.ConsistentPoint.String(), lastSeq, cutoverAt, nil, onStream, &rep); err != nil {
		return rep, err
	}
	s.close()
	// The incarnation knows the stream by its last message from now on: a
	// tailer that finds it gone, or the stream purged past it, refuses it.
	last, seen, err := pub.LastMark(ctx)
	if err != nil {
		return rep, err
	}
	rep.StreamSeq = last.Seq
	if err := replication.FinishResync(ctx, db, &rec, s.snap.ConsistentPoint, replication.StreamIdentity{Name: dest.Name, Created: pub.Created()}, rep.StreamSeq,
		last.Mark, replication.StreamSeen{First: seen.First, Last: seen.Last, Deleted: seen.Deleted, Batches: seen.Batches, Trims: seen.Trims, Quiet: true, Keeps: seen.Keeps}); err != nil {
		return rep, err
	}
	return rep, nil
}

// begin refuses what the server cannot do before anything changes, then
// drops the slot and records the new incarnation's resync as pending.
func begin(ctx context.Context, q *pgx.Conn, db replication.SchemaConn, opts Options, rep *Report) (replication.Record, bool, error) {
	major, err := replication.ServerMajor(ctx, q)
	if err != nil {
		return replication.Record{}, false, err
	}
	failover, err := replication.WantFailover(opts.Failover, major)
	if err != nil {
		return replication.Record{}, false, fmt.Errorf("slot failover: %w", err)
	}
	// A schema the tailer cannot read (row-level security among it) would
	// fail the snapshot's read half way, the old slot gone.
	if err := join.CheckSchema(ctx, q, db.Schema); err != nil {
		return replication.Record{}, false, fmt.Errorf("nothing was changed: %w", err)
	}
	// A slot made now that a publication does not feed would miss the
	// inserts from its snapshot on, as the old one did.
	if opts.Publication != "" {
		if err := replication.CheckPublication(ctx, db, opts.Publication); err != nil {
			return replication.Record{}, false, fmt.Errorf("nothing was changed: %w", err)
		}
	}
	old, err := replication.LoadRecord(ctx, db, opts.Slot)
	if err != nil {
		return replication.Record{}, false, err
	}
	rep.Cutover = opts.Cutover
	if rep.Cutover == nil {
		rep.Cutover = old.Cutover
	}
	// Nothing changes before the slot is dropped, and PostgreSQL refuses
	// to drop a slot that some process streams from.
	slot, err := replication.Slot(ctx, q, opts.Slot)
	switch {
	case err == nil && slot.Active:
		return replication.Record{}, false, fmt.Errorf("slot %s is in use by process %d (pg_stat_replication), which does not hold the tailer's lease: stop it first", opts.Slot, slot.ActivePID)
	case err == nil:
		if err := replication.DropSlot(ctx, q, opts.Slot); err != nil {
			return replication.Record{}, false, err
		}
	case !errors.Is(err, replication.ErrNoSlot):
		return replication.Record{}, false, err
	}
	rec, err := replication.BeginResync(ctx, db, opts.Slot, opts.By, rep.Cutover)
	if err != nil {
		return replication.Record{}, false, err
	}
	rep.Incarnation = rec.Incarnation
	return rec, failover, nil
}

// snapshotted is the new slot's snapshot, held by two transactions: tx
// reads the candidates, jtx is the pipeline's join, which runs meanwhile.
type snapshotted struct {
	snap   replication.Snapshot
	origin relay.Origin
	tx     pgx.Tx
	jq     *pgx.Conn
	jtx    pgx.Tx
}

// close ends the transactions (the snapshot with them); it may be called
// again.
func (s *snapshotted) close() {
	if s.tx != nil {
		s.tx.Rollback(context.Background())
	}
	if s.jtx != nil {
		s.jtx.Rollback(context.Background())
	}
	if s.jq != nil {
		s.jq.Close(context.Background())
	}
}

// openSnapshot makes the slot with a snapshot and opens the two
// transactions that hold it.
func openSnapshot(ctx context.Context, q *pgx.Conn, opts Options, failover bool) (*snapshotted, error) {
	rc, err := replication.Connect(ctx, opts.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer rc.Close(context.Background())
	ident, err := pglogrepl.IdentifySystem(ctx, rc)
	if err != nil {
		return nil, fmt.Errorf("identify system: %w", err)
	}
	// Before the slot: its exported snapshot lasts only while the
	// connection runs no other command.
	history, err := replication.TimelineBranches(ctx, rc, ident.Timeline)
	if err != nil {
		return nil, err
	}
	s := &snapshotted{origin: publish.OriginOf(ident.SystemID, ident.Timeline, ident.DBName, history)}
	if s.snap, err = replication.CreateSlotWithSnapshot(ctx, rc, opts.Slot, failover); err != nil {
		return nil, err
	}
	if s.tx, err = snapshotTx(ctx, q, s.snap); err != nil {
		return nil, err
	}
	if s.jq, err = replication.Open(ctx, opts.DatabaseURL, "tailer resync", join.SessionSettings()); err != nil {
		s.close()
		return nil, err
	}
	if s.jtx, err = snapshotTx(ctx, s.jq, s.snap); err != nil {
		s.close()
		return nil, err
	}
	// The transactions hold the snapshot now; the replication connection
	// is done (closed on return).
	return s, nil
}

// countTokens counts the snapshot's eligible and expired tokens into rep
// and returns the keys of the tokens the stream holds from the time of the
// oldest eligible one.
func countTokens(ctx context.Context, tx pgx.Tx, pub *publish.Publisher, opts Options, lastSeq, cutoverAt *int64, rep *Report) (*token.KeySet, error) {
	var oldest *int64
	if err := tx.QueryRow(ctx, `SELECT min(t.created_at)::bigint, count(*) FROM `+tokensJoinAccounts(opts.Schema)+` WHERE `+
		join.Eligible()+` AND `+notSent, lastSeq, cutoverAt).Scan(&oldest, &rep.Eligible); err != nil {
		return nil, fmt.Errorf("count eligible tokens: %w", err)
	}
	var since int64
	if t := pub.LastTime(); !t.IsZero() {
		since = t.Add(-opts.ClockSkew).Unix()
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+opts.Schema.Name("tokens")+` t WHERE `+notSent+` AND NOT (`+join.Consumed+`) AND `+join.Expired+
		` AND t.created_at > $3`, lastSeq, cutoverAt, since).Scan(&rep.Expired); err != nil {
		return nil, fmt.Errorf("count expired tokens: %w", err)
	}
	onStream := &token.KeySet{}
	if oldest != nil {
		var err error
		if onStream, rep.SetAside, err = subscriber.KeysSince(ctx, pub.Stream(), time.Unix(*oldest, 0).Add(-opts.ClockSkew), pub.LastSeq()); err != nil {
			return nil, err
		}
	}
	return onStream, nil
}

// publishSnapshot feeds the snapshot's tokens that the stream lacks to a
// publish.Pipeline, cut into batches as tailer run cuts them.
func publishSnapshot(ctx context.Context, tx, jtx pgx.Tx, pub *publish.Publisher, nc *nats.Conn, opts Options, inFlight int, name string,
	lastSeq, cutoverAt *int64, ids []int64, onStream *token.KeySet, rep *Report) error {
	batcher := batch.NewBatcher(opts.BatchLimit, time.Hour, nil)
	if opts.Destination.PerAction {
		batcher.SetLanes(batch.ByAction)
	}
	count := &counter{}
	pipeline := &publish.Pipeline{
		Publisher:   pub,
		Joiner:      join.NewJoiner(jtx, opts.Schema),
		Encoder:     publish.NewEncoder(opts.Signer, opts.Format),
		Format:      opts.Format,
		MaxInFlight: inFlight,
		MaxBatches:  opts.MaxBatches,
		MaxBytes:    int(nc.MaxPayload()),
		Done:        batcher.Recycle,
		Observer:    count,
		Log:         opts.Log,
		Snapshot:    name,
	}
	in := make(chan *batch.Batch, 4)
	pipeCtx, stopPipe := context.WithCancel(ctx)
	defer stopPipe()
	pipeErr := make(chan error, 1)
	go func() { pipeErr <- pipeline.Run(pipeCtx, in) }()
	send := func(b *batch.Batch) error {
		select {
		case in <- b:
			return nil
		case err := <-pipeErr:
			pipeErr <- err
			return fmt.Errorf("publish the snapshot: %w", err)
		}
	}
	err := readCandidates(ctx, tx, opts.Schema, lastSeq, cutoverAt, ids, func(t *decoder.Token) error {
		if onStream.Has(token.RawKeyOf(&t.Secret)) {
			rep.OnStream++
			return nil
		}
		if b := batcher.Add(t); b != nil {
			return send(b)
		}
		return nil
	}, opts.Log)
	if err == nil {
		for _, b := range batcher.CutAll(batch.CutShutdown, nil) {
			if err = send(b); err != nil {
				break
			}
		}
	}
	close(in)
	if err != nil {
		stopPipe()
		<-pipeErr
		return err
	}
	if err := <-pipeErr; err != nil {
		return fmt.Errorf("publish the snapshot: %w", err)
	}
	rep.Messages, rep.Published = int(count.messages.Load()), int(count.published.Load())
	rep.Unsafe, rep.Skipped = int(count.unsafe.Load()), int(count.skipped.Load())
	return nil
}

// readCandidates calls f with every token of the snapshot still to be
// mailed, in id order. A row that cannot be signed is logged and left out.
func readCandidates(ctx context.Context, tx pgx.Tx, schema pgname.Schema, lastSeq, cutoverAt *int64, ids []int64, f func(*decoder.Token) error, log *slog.Logger) error {
	rows, err := tx.Query(ctx, `SELECT t.id, t.action::text, t.secret, t.code FROM `+tokensJoinAccounts(schema)+` WHERE `+
		join.Eligible()+` AND `+notSent+` AND ($3::bigint[] IS NULL OR t.id = ANY($3)) ORDER BY t.id`, lastSeq, cutoverAt, ids)
	if err != nil {
		return fmt.Errorf("read eligible tokens: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			t      decoder.Token
			label  string
			secret []byte
			code   *string
		)
		if err := rows.Scan(&t.ID, &label, &secret, &code); err != nil {
			return fmt.Errorf("read eligible tokens: %w", err)
		}
		if t.Action, err = action.Parse(label); err != nil || len(secret) != len(t.Secret) || (code != nil && len(*code) > len(t.Code)) {
			if log != nil {
				log.Warn("token not published: its row cannot be signed", "reason", join.SkipMalformed.String(), "token_id", t.ID)
			}
			continue
		}
		copy(t.Secret[:], secret)
		if code == nil {
			t.CodeNull = true
		} else {
			t.CodeLen = uint8(copy(t.Code[:], *code))
		}
		if err := f(&t); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read eligible tokens: %w", err)
	}
	return nil
}

// counter is the pipeline's Observer: what the resync published and
// skipped. Its methods run on the pipeline's two goroutines.
type counter struct {
	messages, published, unsafe, skipped atomic.Int64
}

func (c *counter) BatchPublished(*batch.Batch, int, time.Duration) {}
func (c *counter) BatchDone(*batch.Batch)                          {}
func (c *counter) Joined(int, time.Duration)                       {}

func (c *counter) MessagePublished(_, tokens int, _ time.Duration) {
	c.messages.Add(1)
	c.published.Add(int64(tokens))
}

func (c *counter) TokensSkipped(reason join.Skip, n int) {
	if reason == join.SkipUnsafeField {
		c.unsafe.Add(int64(n))
	} else {
		c.skipped.Add(int64(n))
	}
}

// tokensJoinAccounts is the tokens t of schema joined with their accounts a.
func tokensJoinAccounts(schema pgname.Schema) string {
	return schema.Name("tokens") + ` t JOIN ` + schema.Name("accounts") + ` a ON a.id = t.account`
}

// snapshotTx begins a read-only transaction on conn that sees snap.
func snapshotTx(ctx context.Context, conn *pgx.Conn, snap replication.Snapshot) (pgx.Tx, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("begin snapshot transaction: %w", err)
	}
	// The name was checked by CreateSlotWithSnapshot: the command takes no
	// parameters.
	if _, err := tx.Exec(ctx, `SET TRANSACTION SNAPSHOT '`+snap.Name+`'`); err != nil {
		tx.Rollback(context.Background())
		return nil, fmt.Errorf("import the slot's snapshot: %w", err)
	}
	return tx, nil
}

// CollectorCursor returns where mailroom's collector stopped (jobs.last_seq
// of job_type 'mailroom' in db's schema, with the database's clock as the
// cutover time), or nil in a database without one.
func CollectorCursor(ctx context.Context, db replication.SchemaConn) (*replication.Cutover, error) {
	var (
		seq *int64
		now int64
	)
	err := db.QueryRow(ctx, `SELECT last_seq, extract(epoch FROM now())::bigint FROM `+db.Schema.Name("jobs")+` WHERE job_type = 'mailroom'`).Scan(&seq, &now)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && (pgErr.Code == pgerrcode.UndefinedTable || pgErr.Code == pgerrcode.UndefinedColumn):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read the collector's cursor (jobs.last_seq): %w", err)
	}
	c := &replication.Cutover{At: now}
	if seq != nil {
		c.LastSeq = *seq
	}
	return c, nil
}

// whileHeld is ctx, ended with the lease's error once the lease is lost:
// the work under it stops rather than go on unowned.
func whileHeld(ctx context.Context, lease *replication.Lease) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-lease.Lost():
			cancel(lease.Err())
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
