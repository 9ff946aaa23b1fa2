package resync

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/mailroom/tailer/publish/relay"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/mailroom/tailer/publish"
	"github.com/mailroom/tailer/publish/join"
	"github.com/mailroom/tailer/publish/subscriber"
	"github.com/mailroom/tailer/replication"
)

// Heal publishes, once, the tokens of ids that are still eligible and
// that the stream lacks (read back by key), as a resync publishes its
// snapshot's: after session markers of the slot's incarnation, in batches
// whose ids are made of the tokens' ids (a heal run again within the
// stream's duplicate window stores nothing twice; every consumer drops a
// token it has by key). The slot and its incarnation stay as they are.
// The caller holds the slot's lease: no tailer run publishes meanwhile,
// so what the stream holds at the end is recorded as at a clean stop.
func Heal(ctx context.Context, lease *replication.Lease, nc *nats.Conn, opts Options, ids []int64) (Report, error) {
	rep := Report{Slot: opts.Slot}
	if len(ids) == 0 {
		return rep, nil
	}
	ctx, cancel := whileHeld(ctx, lease)
	defer cancel(nil)
	q, err := replication.Open(ctx, opts.DatabaseURL, "tailer audit", nil)
	if err != nil {
		return rep, err
	}
	defer q.Close(context.Background())
	db := replication.SchemaConn{Querier: q, Schema: opts.Schema}
	rec, err := replication.LoadRecord(ctx, db, opts.Slot)
	switch {
	case err != nil:
		return rep, err
	case !rec.Exists || rec.ResyncPending:
		return rep, fmt.Errorf("slot %s has no finished record to heal for (run tailer resync)", opts.Slot)
	}
	rep.Incarnation = rec.Incarnation
	dest := opts.Destination
	if dest.Origin, err = originOf(ctx, opts.DatabaseURL); err != nil {
		return rep, err
	}
	pub, err := publish.NewPublisher(ctx, nc, dest)
	if err != nil {
		return rep, err
	}
	defer pub.Close()
	inFlight := cmp.Or(opts.MaxInFlight, publish.InFlightFor(pub.Replicas()))
	if err := pub.Resume(ctx, relay.Owner{Origin: dest.Origin, Incarnation: rec.Incarnation, Since: pub.LastSeq(), InFlight: inFlight}); err != nil {
		return rep, err
	}
	if err := healTokens(ctx, q, pub, nc, opts, inFlight, ids, &rep); err != nil {
		return rep, err
	}
	last, seen, err := pub.LastMark(ctx)
	if err != nil {
		return rep, err
	}
	rep.StreamSeq = last.Seq
	return rep, replication.SetAnchor(ctx, db, opts.Slot, rec.Incarnation, last.Seq, last.Mark,
		replication.StreamSeen{First: seen.First, Last: seen.Last, Deleted: seen.Deleted, Batches: seen.Batches, Trims: seen.Trims, Quiet: true, Keeps: seen.Keeps})
}

// HealAsking is Heal under the slot's lease, taken for it: a tailer run
// that holds the lease is asked to let go of it (replication.AskHeal: it
// looks at each of its checks, and streams again once the request is
// cleared) and waited for up to wait. The ids healed are taken out of
// what audits found missing. app names the healer in pg_stat_activity.
func HealAsking(ctx context.Context, nc *nats.Conn, opts Options, ids []int64, app string, wait time.Duration) (Report, error) {
	q, err := replication.Open(ctx, opts.DatabaseURL, app, nil)
	if err != nil {
		return Report{Slot: opts.Slot}, err
	}
	defer q.Close(context.Background())
	db := replication.SchemaConn{Querier: q, Schema: opts.Schema}
	lease, err := replication.AcquireLease(ctx, opts.DatabaseURL, opts.Slot, replication.LeaseOptions{Application: app, Wait: time.Second})
	var held *replication.LeaseHeldError
	if errors.As(err, &held) {
		if opts.Log != nil {
			opts.Log.Info("asking the tailer run that holds the slot to let go of it for the heal", "slot", opts.Slot, "holder", held.Holder.String())
		}
		if err := replication.AskHeal(ctx, db, opts.Slot); err != nil {
			return Report{Slot: opts.Slot}, err
		}
		defer replication.ClearHeal(context.WithoutCancel(ctx), db, opts.Slot)
		lease, err = replication.AcquireLease(ctx, opts.DatabaseURL, opts.Slot, replication.LeaseOptions{Application: app, Wait: wait, Asked: true})
	}
	if err != nil {
		return Report{Slot: opts.Slot}, err
	}
	defer lease.Release()
	rep, err := Heal(ctx, lease, nc, opts, ids)
	if err != nil {
		return rep, err
	}
	return rep, replication.RemoveAuditMissing(ctx, db, opts.Slot, ids)
}

// healTokens publishes the tokens of ids still eligible that the stream
// lacks, read in two transactions of their own (the candidates, the join).
func healTokens(ctx context.Context, q *pgx.Conn, pub *publish.Publisher, nc *nats.Conn, opts Options, inFlight int, ids []int64, rep *Report) error {
	tx, err := q.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.Background())
	jq, err := replication.Open(ctx, opts.DatabaseURL, "tailer audit", join.SessionSettings())
	if err != nil {
		return err
	}
	defer jq.Close(context.Background())
	jtx, err := jq.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer jtx.Rollback(context.Background())
	var oldest *int64
	if err := tx.QueryRow(ctx, `SELECT min(t.created_at)::bigint, count(*) FROM `+tokensJoinAccounts(opts.Schema)+` WHERE `+join.Eligible()+` AND t.id = ANY($1)`, ids).
		Scan(&oldest, &rep.Eligible); err != nil {
		return fmt.Errorf("count the tokens to heal: %w", err)
	}
	if oldest == nil {
		return nil
	}
	onStream, setAside, err := subscriber.KeysSince(ctx, pub.Stream(), time.Unix(*oldest, 0).Add(-opts.ClockSkew), pub.LastSeq())
	if err != nil {
		return err
	}
	rep.SetAside = setAside
	return publishSnapshot(ctx, tx, jtx, pub, nc, opts, inFlight, healName(ids), nil, nil, ids, onStream, rep)
}

// healName names a heal's batches after the tokens it was asked for:
// the same heal run again makes the same batch ids.
func healName(ids []int64) string {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	h := sha256.New()
	for _, id := range sorted {
		h.Write(strconv.AppendInt(nil, id, 10))
		h.Write([]byte{','})
	}
	return "heal-" + hex.EncodeToString(h.Sum(nil)[:8])
}

// originOf is where the database's stream comes from, as the replication
// protocol identifies it (publish.OriginOf).
func originOf(ctx context.Context, url string) (relay.Origin, error) {
	rc, err := replication.Connect(ctx, url)
	if err != nil {
		return relay.Origin{}, err
	}
	defer rc.Close(context.Background())
	ident, err := pglogrepl.IdentifySystem(ctx, rc)
	if err != nil {
		return relay.Origin{}, fmt.Errorf("identify system: %w", err)
	}
	history, err := replication.TimelineBranches(ctx, rc, ident.Timeline)
	if err != nil {
		return relay.Origin{}, err
	}
	return publish.OriginOf(ident.SystemID, ident.Timeline, ident.DBName, history), nil
}
