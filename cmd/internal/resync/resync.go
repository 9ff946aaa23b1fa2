// Package resync recreates the tailer's slot from a snapshot and publishes,
// once, the tokens the stream lacks: after the server invalidated the slot
// (or it was dropped), or when adopting a database that ran mailroom's
// collector.
//
// The slot is created with an exported snapshot: every token committed
// before the slot's consistent point is visible in the snapshot, every later
// one is decoded from the slot by tailer run. In the snapshot the resync
// selects the still-eligible tokens, reads the keys of the tokens the stream
// already holds (a short window: tokens live minutes) and publishes the
// rest. A row in tailer_resync says a resync is under way; tailer run does
// not stream from the slot until the row says it is done, and a resync
// killed half way is finished by running it again (the slot is recreated
// once more and the stream read again, so nothing is published twice).
package resync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/batch/join"
	"github.com/mailroom/tailer/decoder"
	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/consume"
	"github.com/mailroom/tailer/publish/wire"
	"github.com/mailroom/tailer/replication"
)

// State is the tailer_resync row of a slot.
type State struct {
	// Exists is false when the slot was never resynced (or the table is
	// not there: the migrations predate it).
	Exists bool
	Done   bool
	// AfterID is the collector's cursor when adopting its database.
	AfterID *int64
	// StreamSeq is the stream's last sequence when the resync finished.
	StreamSeq uint64
}

// Pending reports whether a resync was started and not finished: the
// slot must not be streamed from until it is.
func (s State) Pending() bool { return s.Exists && !s.Done }

// PendingMessage says what a pending resync means, for logs and /readyz.
func PendingMessage(slot string) string {
	return fmt.Sprintf("a resync of slot %s was started and did not finish: the tokens of its snapshot are not all on the stream. "+
		"Run `tailer resync` again (or `tailer migrate`, when it was adopting a collector's database); tailer run waits until then", slot)
}

// Querier is the part of pgx.Conn the state functions use.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Load reads the resync state of slot.
func Load(ctx context.Context, q Querier, slot string) (State, error) {
	var (
		s       State
		done    bool
		seq     *int64
		afterID *int64
	)
	err := q.QueryRow(ctx, `SELECT done_at IS NOT NULL, stream_seq, after_id FROM tailer_resync WHERE slot = $1`, slot).Scan(&done, &seq, &afterID)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "42P01":
		return s, nil
	case err != nil:
		return s, fmt.Errorf("read resync state of slot %s: %w", slot, err)
	}
	s.Exists, s.Done, s.AfterID = true, done, afterID
	if seq != nil {
		s.StreamSeq = uint64(*seq)
	}
	return s, nil
}

// CollectorCursor returns mailroom's collector cursor (jobs.last_seq of
// job_type 'mailroom'); ok is false in a database without one.
func CollectorCursor(ctx context.Context, q Querier) (lastSeq int64, ok bool, err error) {
	var seq *int64
	err = q.QueryRow(ctx, `SELECT last_seq FROM jobs WHERE job_type = 'mailroom'`).Scan(&seq)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703"):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("read the collector's cursor (jobs.last_seq): %w", err)
	}
	if seq != nil {
		lastSeq = *seq
	}
	return lastSeq, true, nil
}

// Options configure a resync.
type Options struct {
	DatabaseURL string
	Slot        string
	// Destination is where tokens are published; its Origin is set by Run.
	Destination publish.Destination
	Signer      *publish.Signer
	Format      wire.Format
	BatchLimit  int
	MaxInFlight int
	// AfterID, when set, limits a new resync to tokens with a greater id
	// (adopting a collector's database: its jobs.last_seq). A pending
	// resync is finished with the cursor it started with.
	AfterID *int64
	// ClockSkew is how far the database's and NATS's clocks may disagree;
	// the stream is read from the oldest candidate's creation less this.
	ClockSkew time.Duration
	Log       *slog.Logger
}

// Report says what a resync did.
type Report struct {
	Slot            string
	ConsistentPoint pglogrepl.LSN
	AfterID         *int64
	// Eligible tokens in the snapshot; OnStream of them were already
	// published, Published were published now, Unsafe were not
	// (unsafe_field, line format).
	Eligible, OnStream, Published, Unsafe int
	// Expired counts tokens that expired without being published: not
	// consumed, created after the stream's last message (or ever, for an
	// empty stream), expired by the time of the snapshot.
	Expired int
	// Messages published, and the stream's last sequence afterwards.
	Messages  int
	StreamSeq uint64
}

// The tokens that are still to be mailed, as the join decides for tailer
// run: not expired, not consumed, and the account's status fits the action.
const eligible = `
FROM tokens t JOIN accounts a ON a.id = t.account
WHERE t.id > $1
  AND t.consumed_at IS NULL
  AND t.expires_at > extract(epoch FROM now())::bigint
  AND CASE t.action WHEN 'activation' THEN a.status = 'provisioned'
                    WHEN 'password_recovery' THEN a.status = 'active' ELSE false END`

// Run performs a resync of opts.Slot, publishing through nc. Every tailer
// run must be stopped: a slot in use is refused.
func Run(ctx context.Context, nc *nats.Conn, opts Options) (Report, error) {
	rep := Report{Slot: opts.Slot}
	if opts.BatchLimit <= 0 {
		opts.BatchLimit = 10
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 256
	}
	if opts.ClockSkew <= 0 {
		opts.ClockSkew = 5 * time.Minute
	}
	qcfg, err := pgx.ParseConfig(opts.DatabaseURL)
	if err != nil {
		return rep, fmt.Errorf("parse database URL: %w", err)
	}
	qcfg.RuntimeParams["application_name"] = "tailer resync"
	q, err := pgx.ConnectConfig(ctx, qcfg)
	if err != nil {
		return rep, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer q.Close(context.Background())

	st, err := Load(ctx, q, opts.Slot)
	if err != nil {
		return rep, err
	}
	rep.AfterID = opts.AfterID
	if st.Pending() {
		rep.AfterID = st.AfterID
	}
	after := int64(0)
	if rep.AfterID != nil {
		after = *rep.AfterID
	}
	// Said before the slot is touched, so that a tailer run that gets the
	// new slot does not stream from it until the snapshot is published.
	if _, err := q.Exec(ctx, `
		INSERT INTO tailer_resync (slot, after_id) VALUES ($1, $2)
		ON CONFLICT (slot) DO UPDATE SET after_id = EXCLUDED.after_id, started_at = now(),
			consistent_point = NULL, stream_seq = NULL, done_at = NULL`, opts.Slot, rep.AfterID); err != nil {
		return rep, fmt.Errorf("record the resync of slot %s (has `tailer migrate` run?): %w", opts.Slot, err)
	}

	old, err := replication.Slot(ctx, q, opts.Slot)
	switch {
	case err == nil && old.Active:
		return rep, fmt.Errorf("slot %s is in use by process %d: stop every tailer run first", opts.Slot, old.ActivePID)
	case err == nil:
		if err := replication.DropSlot(ctx, q, opts.Slot); err != nil {
			return rep, err
		}
	case !errors.Is(err, replication.ErrNoSlot):
		return rep, err
	}

	rc, err := replication.Connect(ctx, opts.DatabaseURL)
	if err != nil {
		return rep, err
	}
	defer rc.Close(context.Background())
	ident, err := pglogrepl.IdentifySystem(ctx, rc)
	if err != nil {
		return rep, fmt.Errorf("identify system: %w", err)
	}
	snap, err := replication.CreateSlotWithSnapshot(ctx, rc, opts.Slot)
	if err != nil {
		return rep, err
	}
	rep.ConsistentPoint = snap.ConsistentPoint
	tx, err := q.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return rep, fmt.Errorf("begin snapshot transaction: %w", err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SET TRANSACTION SNAPSHOT '`+snap.Name+`'`); err != nil {
		return rep, fmt.Errorf("import the slot's snapshot: %w", err)
	}
	// The transaction holds the snapshot now; the replication connection
	// is done.
	rc.Close(context.Background())

	dest := opts.Destination
	dest.Origin = publish.Origin{SystemID: ident.SystemID, Timeline: ident.Timeline, Database: ident.DBName}
	pub, err := publish.NewPublisher(ctx, nc, dest)
	if err != nil {
		return rep, err
	}
	defer pub.Close()

	var oldest *int64
	if err := tx.QueryRow(ctx, `SELECT min(t.created_at)::bigint, count(*) `+eligible, after).Scan(&oldest, &rep.Eligible); err != nil {
		return rep, fmt.Errorf("count eligible tokens: %w", err)
	}
	var since int64
	if t := pub.LastTime(); !t.IsZero() {
		since = t.Add(-opts.ClockSkew).Unix()
	}
	if err := tx.QueryRow(ctx, `
		SELECT count(*) FROM tokens t
		WHERE t.id > $1 AND t.consumed_at IS NULL AND t.created_at > $2
		  AND t.expires_at <= extract(epoch FROM now())::bigint`, after, since).Scan(&rep.Expired); err != nil {
		return rep, fmt.Errorf("count expired tokens: %w", err)
	}
	onStream := map[string]struct{}{}
	if oldest != nil {
		if onStream, err = consume.KeysSince(ctx, pub.Stream(), time.Unix(*oldest, 0).Add(-opts.ClockSkew), pub.LastSeq()); err != nil {
			return rep, err
		}
	}
	s := &sender{opts: opts, pub: pub, enc: publish.NewEncoder(opts.Signer, opts.Format), rep: &rep,
		id: "resync-" + snap.ConsistentPoint.String() + "-", maxBytes: int(nc.MaxPayload())}
	if err := s.publishEligible(ctx, tx, after, onStream); err != nil {
		return rep, err
	}
	if err := tx.Commit(ctx); err != nil {
		return rep, fmt.Errorf("end snapshot transaction: %w", err)
	}
	if rep.StreamSeq == 0 {
		rep.StreamSeq = pub.LastSeq()
	}
	if _, err := q.Exec(ctx, `UPDATE tailer_resync SET done_at = now(), consistent_point = $2, stream_seq = $3 WHERE slot = $1`,
		opts.Slot, snap.ConsistentPoint.String(), int64(rep.StreamSeq)); err != nil {
		return rep, fmt.Errorf("record the end of the resync of slot %s: %w", opts.Slot, err)
	}
	return rep, nil
}

// sender publishes the snapshot's tokens in batches of BatchLimit per lane.
type sender struct {
	opts Options
	pub  *publish.Publisher
	enc  *publish.Encoder
	rep  *Report
	id   string
	// maxBytes is the server's max_payload.
	maxBytes int
	lanes    [2][]pending
	acks     []ack
}

type pending struct {
	tok decoder.Token
	row join.TokenState
}

type ack struct {
	id  string
	fut jetstream.PubAckFuture
}

func (s *sender) publishEligible(ctx context.Context, tx pgx.Tx, after int64, onStream map[string]struct{}) error {
	rows, err := tx.Query(ctx, `SELECT t.id, t.action::text, t.secret, t.code, t.expires_at::bigint, a.email::text, a.login::text `+eligible+` ORDER BY t.id`, after)
	if err != nil {
		return fmt.Errorf("read eligible tokens: %w", err)
	}
	defer rows.Close()
	var key []byte
	for rows.Next() {
		var (
			p            pending
			action       string
			secret       []byte
			code         *string
			email, login string
		)
		if err := rows.Scan(&p.tok.ID, &action, &secret, &code, &p.row.ExpiresAt, &email, &login); err != nil {
			return fmt.Errorf("read eligible tokens: %w", err)
		}
		if p.tok.Action, err = decoder.ParseAction(action); err != nil || len(secret) != 32 || (code != nil && len(*code) > len(p.tok.Code)) {
			s.log("token not published: its row cannot be signed", "token_id", p.tok.ID)
			continue
		}
		copy(p.tok.Secret[:], secret)
		if code == nil {
			p.tok.CodeNull = true
		} else {
			p.tok.CodeLen = uint8(copy(p.tok.Code[:], *code))
		}
		key = wire.AppendKey(key[:0], &p.tok.Secret)
		if _, ok := onStream[string(key)]; ok {
			s.rep.OnStream++
			continue
		}
		p.row.Email, p.row.Login = []byte(email), []byte(login)
		lane := 0
		if s.opts.Destination.PerAction {
			lane = int(p.tok.Action) - 1
		}
		s.lanes[lane] = append(s.lanes[lane], p)
		if len(s.lanes[lane]) >= s.opts.BatchLimit {
			if err := s.flush(ctx, lane); err != nil {
				return err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read eligible tokens: %w", err)
	}
	for lane := range s.lanes {
		if err := s.flush(ctx, lane); err != nil {
			return err
		}
	}
	return s.wait(ctx, 0)
}

func (s *sender) flush(ctx context.Context, lane int) error {
	batch := s.lanes[lane]
	tokens := make([]decoder.Token, len(batch))
	rows := make([]join.TokenState, len(batch))
	for i := range batch {
		tokens[i], rows[i] = batch[i].tok, batch[i].row
	}
	s.lanes[lane] = batch[:0]
	for start := 0; start < len(tokens); {
		id := fmt.Sprintf("%s%d", s.id, s.rep.Messages+1)
		enc := s.enc.Encode(nil, func(int) string { return id }, tokens[start:], rows[start:], s.maxBytes)
		for i := start; i < start+enc.Covered; i++ {
			if rows[i].Skip == join.SkipUnsafeField {
				s.rep.Unsafe++
				s.log("token not published in a line: its email or login holds a comma, CR, LF or NUL, or exceeds 254 bytes", "reason", "unsafe_field", "token_id", tokens[i].ID)
			} else if rows[i].Skip == join.SkipMalformed {
				s.log("token not published: it cannot be signed", "token_id", tokens[i].ID)
			}
		}
		start += enc.Covered
		if enc.N == 0 {
			continue
		}
		fut, err := s.pub.PublishAsync(&publish.Message{
			Lane: lane, ID: id, Resync: s.rep.ConsistentPoint.String(), Count: enc.N,
			TokenIDs: enc.IDs, TokenKeys: enc.Keys, Format: s.opts.Format, Body: enc.Body,
		})
		if err != nil {
			return err
		}
		s.rep.Messages++
		s.rep.Published += enc.N
		s.acks = append(s.acks, ack{id, fut})
		if err := s.wait(ctx, s.opts.MaxInFlight); err != nil {
			return err
		}
	}
	return nil
}

// wait collects PubAcks, oldest first, until at most keep are outstanding.
func (s *sender) wait(ctx context.Context, keep int) error {
	for len(s.acks) > keep {
		a := s.acks[0]
		select {
		case pa := <-a.fut.Ok():
			if pa.Duplicate {
				if err := s.pub.CheckDuplicate(ctx, a.id, pa.Sequence); err != nil {
					return err
				}
			}
			s.rep.StreamSeq = pa.Sequence
		case err := <-a.fut.Err():
			return fmt.Errorf("publish batch %s: %w", a.id, err)
		case <-ctx.Done():
			return errors.Join(errors.New("waiting for PubAck"), ctx.Err())
		}
		s.acks = s.acks[1:]
	}
	return nil
}

func (s *sender) log(msg string, args ...any) {
	if s.opts.Log != nil {
		s.opts.Log.Warn(msg, args...)
	}
}
