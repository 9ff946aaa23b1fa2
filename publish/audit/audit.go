package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/publish/token"
	"github.com/mailroom/tailer/publish/wire"
)

// Options say what an audit reads.
type Options struct {
	Schema pgname.Schema
	Slot   string
	// Since is the window's start: the tokens created from then on (not
	// before the slot was made, unless a resync published what was before
	// it). Until is its end; zero: as far as the slot's record says it is
	// confirmed (confirmed_through), less Grace. MaxSpan, when set, bounds
	// the window's length: a catching-up audit's cost.
	Since, Until time.Time
	MaxSpan      time.Duration
	// Grace is how long after its creation a token's batch may be cut
	// (the batch timeout and the lag); within it a token's expiry,
	// consumption or account's change leaves its eligibility undecided.
	// CutBySettle: a token's state is judged through the time the slot
	// confirmed past the audit's snapshot instead, when it did: every
	// batch of the window was cut by then, whatever the lag (tailer run's
	// audit, of the tokens of the last minutes).
	Grace            time.Duration
	CutByConfirmWait bool
	// Lines: the stream carries lines (a token unsafe for one is
	// skipped); else JSON.
	Lines bool
	// ClockSkew is read of the stream before Since, for the two servers'
	// clocks.
	ClockSkew time.Duration
	// Consumer is the read-back consumer's name (subscriber.AuditConsumer,
	// subscriber.AuditRunConsumer).
	Consumer string
	// Durable, when set, is what a durable delivered.
	Durable Durable
	// read, in tests, is called as each key is read back from the stream.
	read func(seq uint64)
	// ConfirmWait is how long to wait for the slot to confirm past the audit's
	// snapshot before the stream is read (default 30 s): then every token
	// the snapshot holds was published, and one the stream lacks is
	// missing, whatever its transaction's length. A slot that does not
	// (tailer run behind or stopped) leaves what the stream lacks pending.
	ConfirmWait time.Duration
	// Settled: an audit whose slot is not confirmed past its snapshot
	// within ConfirmWait reads nothing more, and could not finish (tailer
	// run's audit, while the tailer catches up).
	Settled bool
}

// Durable is what a durable consumer delivered: Through reads the stream
// sequences from which it delivers (0: not known, then from the first
// message its output holds) and through which it acknowledged every
// message (read before the stream), Delivered the keys its output holds
// (read after: a message is acknowledged once its tokens are there).
type Durable interface {
	Through(ctx context.Context) (from, through uint64, err error)
	Delivered(ctx context.Context, since time.Time) (*Counts, error)
}

// Report is what an audit found, and of which window.
type Report struct {
	Since, Until time.Time
	// StreamFirst and StreamLast are the stream's sequences read (0:
	// none); From and Through, the durable's: the tokens of the messages
	// between them it acknowledged must be in its output.
	StreamFirst, StreamLast, From, Through uint64
	Tally
	// SetAside counts messages on the stream that are not the tailer's
	// batches; Trimmed, tokens created before the first message of a
	// stream whose limits remove old messages (their absence proves
	// nothing).
	SetAside, Trimmed int
	// Snapshot is the WAL position of the audit's snapshot, Confirmed the
	// slot's confirmed position when the stream was read, and Settled
	// whether it had reached the snapshot's: if not, the tokens the
	// stream lacks are Pending, not Missing (a transaction that committed
	// them may not be confirmed yet), but those of transactions that
	// ended before the slot's restart point.
	Snapshot, Confirmed string
	Settled             bool
	SettledAt           time.Time
	Pending             []int64
	// horizon is the slot's catalog_xmin before the stream was read: a
	// transaction older than it ended before the slot's restart point,
	// and its tokens were published, whether or not the slot is settled.
	horizon *string
}

// ErrIncomplete wraps why an audit could not finish: it then reports
// nothing missing.
var ErrIncomplete = errors.New("the audit could not finish")

// ErrBehind is why an audit with Options.Settled could not finish: the
// tailer is behind (wrapped with ErrIncomplete).
var ErrBehind = errors.New("the tailer is behind")

// ErrNothingConfirmed is why an audit of a slot no tailer confirmed
// anything of yet could not finish (wrapped with ErrIncomplete).
var ErrNothingConfirmed = errors.New("no tailer has confirmed anything of the slot yet")

// Audit compares the tokens of the slot's database, read from one
// snapshot on conn, with the keys stream holds, read after it (each token
// the slot confirmed was on the stream before), and with what opts'
// durable delivered. It changes nothing.
func Audit(ctx context.Context, conn *pgx.Conn, stream jetstream.Stream, opts Options) (Report, error) {
	if opts.Grace <= 0 {
		opts.Grace = time.Minute
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return Report{}, incomplete("read the database", err)
	}
	defer tx.Rollback(context.Background())
	// The snapshot's first statement: every commit it sees lies before.
	var snapshot pglogrepl.LSN
	if err := tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()`).Scan(&snapshot); err != nil {
		return Report{}, incomplete("read the database's WAL position", err)
	}
	w, err := window(ctx, tx, opts)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Since: w.since, Until: w.until, Snapshot: snapshot.String()}
	if !w.until.After(w.since) {
		return rep, nil
	}
	if err := rep.settle(ctx, tx, opts, snapshot); err != nil {
		return Report{}, err
	}
	if opts.Settled && !rep.Settled {
		return rep, fmt.Errorf("%w: %w: the slot (confirmed to %s) is not confirmed past the audit's snapshot (%s) yet", ErrIncomplete, ErrBehind, rep.Confirmed, rep.Snapshot)
	}
	keys, acked, err := readStream(ctx, stream, opts, &rep)
	if err != nil {
		return Report{}, err
	}
	var delivered, deliverable *Counts
	if opts.Durable != nil {
		if delivered, err = opts.Durable.Delivered(ctx, w.since.Add(-opts.ClockSkew)); err != nil {
			return Report{}, incomplete("read what the durable delivered", err)
		}
		deliverable = acked.from(rep.From, delivered)
	}
	err = tokens(ctx, tx, opts.Schema, w, rep.horizon, func(row Row) {
		rep.count(row, opts, keys, deliverable, delivered)
	})
	if err != nil {
		return Report{}, incomplete("read the tokens", err)
	}
	// Rows come in the order of their creation times; ids are said in
	// their own.
	for _, ids := range [][]int64{rep.Missing, rep.Twice, rep.Undelivered, rep.Pending} {
		slices.Sort(ids)
	}
	return rep, nil
}

// settle waits, up to opts.ConfirmWait, for the slot to confirm past the
// snapshot's position: every token the snapshot holds was then published
// before the stream is read. The slot's view is read in the snapshot's
// transaction, and is current all the same.
func (rep *Report) settle(ctx context.Context, tx pgx.Tx, opts Options, snapshot pglogrepl.LSN) error {
	wait := opts.ConfirmWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		var confirmed *pglogrepl.LSN
		err := tx.QueryRow(ctx, `SELECT confirmed_flush_lsn, catalog_xmin::text FROM pg_replication_slots WHERE slot_name = $1`, opts.Slot).Scan(&confirmed, &rep.horizon)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return incomplete("read the slot's confirmed position", err)
		}
		if confirmed != nil {
			rep.Confirmed = confirmed.String()
			rep.Settled, rep.SettledAt = *confirmed >= snapshot, time.Now()
		}
		if rep.Settled || !time.Now().Before(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return incomplete("wait for the slot to confirm past the audit's snapshot", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func incomplete(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrIncomplete, what, err)
}

// streamIncomplete is incomplete for a read of the stream, naming NATS
// when it did not answer.
func streamIncomplete(what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrNoResponders) {
		return incomplete(what+": NATS did not answer (away, or the stream without a leader)", err)
	}
	return incomplete(what, err)
}

// count judges row: a token whose message a trimming stream may have
// removed counts as trimmed; one the durable should have (its message at
// or before Through) against what it delivered.
func (rep *Report) count(row Row, opts Options, keys *streamKeys, deliverable, delivered *Counts) {
	if keys.trims && keys.counts.Of(row.Key) == 0 && row.Created < keys.firstTime.Unix()+int64(opts.ClockSkew.Seconds()) {
		rep.Read++
		rep.Trimmed++
		return
	}
	var d *Counts
	if delivered != nil && deliverable.Of(row.Key) > 0 {
		d = delivered
	}
	cutBy := row.Created + int64(opts.Grace.Seconds())
	if opts.CutByConfirmWait && rep.Settled {
		cutBy = rep.SettledAt.Add(opts.ClockSkew).Unix() + 1
	}
	missing := len(rep.Missing)
	rep.Count(row, cutBy, opts.Lines, keys.counts, d)
	if !rep.Settled && !row.Decoded && len(rep.Missing) > missing {
		rep.Pending, rep.Missing = append(rep.Pending, row.ID), rep.Missing[:missing]
	}
}

// span is the window an audit reads: tokens created in [since, until],
// and the collector's cutover, whose tokens it sent.
type span struct {
	since, until  time.Time
	cutSeq, cutAt *int64
}

// window reads, in the audit's snapshot, how far the slot's record says
// the slot is confirmed, and bounds the window by it.
func window(ctx context.Context, tx pgx.Tx, opts Options) (span, error) {
	var (
		through *time.Time
		made    time.Time
		by      string
		pending bool
		w       = span{since: opts.Since, until: opts.Until}
	)
	err := tx.QueryRow(ctx, `SELECT confirmed_through, created_at, created_by, collector_last_seq, collector_cutover, resync_pending FROM `+opts.Schema.Name("tailer_slot")+` WHERE slot = $1`, opts.Slot).
		Scan(&through, &made, &by, &w.cutSeq, &w.cutAt, &pending)
	switch {
	case err == nil && pending:
		// The stream is being rebuilt: what it lacks now may be on its way.
		return w, fmt.Errorf("%w: a tailer resync of slot %s is under way, or was stopped half way (tailer status): run the audit once it is done", ErrIncomplete, opts.Slot)
	case errors.Is(err, pgx.ErrNoRows):
		return w, fmt.Errorf("%w: slot %s has no record: no tailer has made it (tailer migrate)", ErrIncomplete, opts.Slot)
	case err != nil:
		return w, incomplete("read the slot's record", err)
	case through == nil:
		return w, fmt.Errorf("%w: slot %s: %w", ErrIncomplete, opts.Slot, ErrNothingConfirmed)
	}
	// A slot made by tailer migrate or tailer run captured nothing from
	// before it; one a resync made published its snapshot.
	if !resynced(by) && made.After(w.since) {
		w.since = made
	}
	if limit := through.Add(-opts.Grace); w.until.IsZero() || w.until.After(limit) {
		w.until = limit
	}
	if limit := w.since.Add(opts.MaxSpan); opts.MaxSpan > 0 && w.until.After(limit) {
		w.until = limit
	}
	return w, nil
}

// resynced reports whether the slot's incarnation was made from a
// snapshot it published (tailer resync, a collector's cutover).
func resynced(by string) bool {
	return strings.Contains(by, "resync") || strings.Contains(by, "cutover")
}

// streamKeys are the keys read back: how many times each is there, the
// first message's time, and whether the stream's limits remove old
// messages.
type streamKeys struct {
	counts    *Counts
	firstTime time.Time
	trims     bool
}

// readStream reads every key on the stream from the window's start (less
// the clock skew) to its last message, and, for a durable, those of the
// messages it acknowledged; a stream that lost messages while it was read
// (purged, made again) leaves the audit incomplete: their keys would be
// taken for missing.
func readStream(ctx context.Context, stream jetstream.Stream, opts Options, rep *Report) (*streamKeys, *ackedKeys, error) {
	var through uint64
	if opts.Durable != nil {
		var err error
		if rep.From, through, err = opts.Durable.Through(ctx); err != nil {
			return nil, nil, incomplete("read how far the durable acknowledged", err)
		}
		rep.Through = through
	}
	before, err := stream.Info(ctx)
	if err != nil {
		return nil, nil, streamIncomplete("read the stream", err)
	}
	keys := &streamKeys{counts: &Counts{}, trims: publish.Trims(before.Config)}
	acked := &ackedKeys{}
	from := rep.Since.Add(-opts.ClockSkew)
	first, aside, err := subscriber.ReadKeys(ctx, stream, opts.Consumer, from, before.State.LastSeq, func(seq uint64, _ int, k string) {
		if opts.read != nil {
			opts.read(seq)
		}
		if raw, ok := token.ParseRawKey(k); ok {
			keys.counts.keys, keys.counts.sorted = append(keys.counts.keys, raw), false
			if seq <= through {
				acked.seqs, acked.keys = append(acked.seqs, seq), append(acked.keys, raw)
			}
		}
	})
	if err != nil {
		return nil, nil, streamIncomplete("read the stream's keys", err)
	}
	after, err := stream.Info(ctx)
	if err != nil {
		return nil, nil, streamIncomplete("read the stream", err)
	}
	if !after.Created.Equal(before.Created) || after.State.FirstSeq > max(first, before.State.FirstSeq) && !keys.trims ||
		after.State.NumDeleted > before.State.NumDeleted && !keys.trims {
		return nil, nil, fmt.Errorf("%w: stream %s lost messages while it was read (purged, a message deleted, or made again): run the audit again", ErrIncomplete, before.Config.Name)
	}
	rep.StreamFirst, rep.StreamLast, rep.SetAside = first, before.State.LastSeq, aside
	keys.firstTime = before.State.FirstTime
	return keys, acked, nil
}

// ackedKeys are the keys of the messages a durable acknowledged, with
// their sequences, in stream order.
type ackedKeys struct {
	seqs []uint64
	keys []token.RawKey
}

// from are the keys of the messages from sequence from on (0: from the
// first whose token delivered holds: where the durable started).
func (a *ackedKeys) from(from uint64, delivered *Counts) *Counts {
	c := &Counts{}
	for i, k := range a.keys {
		if from == 0 && delivered.Of(k) > 0 {
			from = a.seqs[i]
		}
		if from != 0 && a.seqs[i] >= from {
			c.keys = append(c.keys, k)
		}
	}
	return c
}

// tokens reads, in the audit's snapshot, every token created in w (but
// those the collector sent), with what decides its eligibility.
func tokens(ctx context.Context, tx pgx.Tx, schema pgname.Schema, w span, horizon *string, f func(Row)) error {
	rows, err := tx.Query(ctx, `SELECT t.id, t.secret, t.created_at::bigint, t.expires_at::bigint, t.consumed_at::bigint,
			`+join.StatusFits()+`, coalesce(a.status_changed_at, 0)::bigint, a.email::text, a.login::text,
			coalesce(age(t.xmin) > age($5::xid), false)
		FROM `+schema.Name("tokens")+` t JOIN `+schema.Name("accounts")+` a ON a.id = t.account
		WHERE t.created_at >= $3 AND t.created_at <= $4
		  AND ($1::bigint IS NULL OR NOT (t.id <= $1::bigint AND t.created_at <= $2::bigint))`,
		w.cutSeq, w.cutAt, w.since.Unix(), w.until.Unix(), horizon)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			row          Row
			secret       []byte
			consumed     *int64
			email, login string
		)
		if err := rows.Scan(&row.ID, &secret, &row.Created, &row.Expires, &consumed, &row.StatusFits, &row.StatusChanged, &email, &login, &row.Decoded); err != nil {
			return err
		}
		if len(secret) != token.SecretSize {
			// No token the tailer could sign: skipped as malformed.
			continue
		}
		row.Key = token.RawKeyOf((*[token.SecretSize]byte)(secret))
		if consumed != nil {
			row.Consumed, row.HasConsumed = *consumed, true
		}
		row.LineSafe = wire.LineSafe([]byte(email)) && wire.LineSafe([]byte(login))
		f(row)
	}
	return rows.Err()
}
