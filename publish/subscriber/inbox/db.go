package inbox

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailroom/tailer/internal/pgname"
	"github.com/mailroom/tailer/publish/subscriber"
)

// DB is the Sink of a subscriber.Subscriber that stores batches in the
// consumer's PostgreSQL through a Table (Inbox, Jobs, or one's own),
// exactly once: the batches at hand in one transaction, a large message's
// in parts; a batch is done once its transaction committed, and a
// message is acknowledged once each of its batches is. A crash before the
// ack, or an ack lost on its way, delivers the message again, and storing
// it again adds only what is not there.
//
// Up to unitsAtOnce transactions run side by side (River's insert alone,
// one transaction at a time, went at about three quarters of its pace
// four at a time, issue 47), and they commit in the order they were cut:
// the last message the database holds a token of is then one before
// which every message is stored, which is where a lost consumer is made
// again (Position), and a process killed between two commits leaves
// nothing behind it unstored. A transaction holding a token of one in
// flight before it (a message delivered again meanwhile) stores only
// after that one committed (claim).
type DB struct {
	Pool  *pgxpool.Pool
	Table Table
	Log   *slog.Logger
	// Added counts the tokens stored; Again the transactions that found
	// tokens of theirs stored before: a delivery whose ack was lost, or
	// never sent.
	Added, Again atomic.Int64

	once  sync.Once
	slots chan struct{}
	// begin begins a store's transaction (storeTx).
	begin pgx.TxOptions
	// last is the transaction cut last; only Hand touches it.
	last *txn
	// keys counts, for each token key, the transactions in flight that
	// store it.
	mu   sync.Mutex
	keys map[string]int
}

// txn is one transaction of the sink's: units stored together, committed
// once the one cut before it committed (prevCommitted), abandoned if that
// one was (prevFailed). It holds the channels of the one before, not the
// transaction: a chain of pointers from the newest would keep every
// transaction of a run, and its tokens, in memory.
type txn struct {
	us                        []*subscriber.Unit
	prevCommitted, prevFailed <-chan struct{}
	committed, failed         chan struct{}
	// after: a token of t's is in a transaction before it, so t stores
	// only once that one committed (claim).
	after bool
}

// Connect opens a pool for a DB on the database at url, its sessions
// searching pg_catalog alone (pgname.Isolate): a table is found by the
// schema a query names, never by a search_path. A transaction of
// the DB's holds its tokens' keys while it waits for the one before it to
// commit, idle in the server's eyes: were its process frozen (SIGSTOP, a
// paused container), nothing would end the wait. So, unless url sets it,
// the server ends a session idle in a transaction for IdleInTransaction:
// the keys are let go, the transaction is stored again (its process says
// so, trying again), and a standby that took over the durable stores past
// it. Another subscriber's transactions waiting on its keys while it waits
// on theirs end sooner, at LockWait.
func Connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pgname.Isolate(cfg.ConnConfig.RuntimeParams)
	if _, set := cfg.ConnConfig.RuntimeParams[idleParam]; !set {
		cfg.ConnConfig.RuntimeParams[idleParam] = strconv.Itoa(int(IdleInTransaction.Milliseconds()))
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// IdleInTransaction is how long Connect's sessions may be idle in a
// transaction: far longer than a transaction waits for the one before
// it while the database works (seconds, for thousands of River jobs).
const IdleInTransaction = time.Minute

const idleParam = "idle_in_transaction_session_timeout"

// LockWait bounds how long a store waits for a lock: a row another
// subscriber's transaction inserted, above all. Two subscribers of a
// durable handed over, each with transactions in flight, can wait for
// each other in a cycle the server cannot see (one of the transactions
// waits for its predecessor in its process, idle in the server's eyes);
// the store waiting on a lock ends, is tried again, and the cycle with
// it. A wait that was no cycle just costs that store a second try.
const LockWait = 5 * time.Second

const lockParam = "lock_timeout"

// storeTx begins a store's transaction, its lock wait bounded (LockWait)
// in the same round trip, unless the pool's URL set lock_timeout.
func storeTx(pool *pgxpool.Pool) pgx.TxOptions {
	if _, set := pool.Config().ConnConfig.RuntimeParams[lockParam]; set {
		return pgx.TxOptions{}
	}
	return pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL " + lockParam + " = " + strconv.Itoa(int(LockWait.Milliseconds()))}
}

// pullBatch is how many messages a pull asks for: those at hand, up to
// the consume loop's group of tokens, are stored together, each
// acknowledged after the commit. Groups of 64 messages, cut into larger
// transactions than groups of 16, cost River a quarter less CPU a token
// (docs/bench/2026-11-27-deployed.md).
const pullBatch = 64

// unitsAtOnce bounds the transactions in flight.
const unitsAtOnce = 4

// minPartTokens: the batches at hand, when more than minPartTokens
// tokens (a backlog's message, with group commit: thousands), are stored
// in up to unitsAtOnce parts of about equal size, no smaller than that,
// so that the store's work (River's, above all) and the database's run
// side by side.
const minPartTokens = 500

// Pulls: the messages of a pull at once, and room for a second pull's
// while the first's are stored.
func (d *DB) Pulls() (pull, pending int) { return pullBatch, 2 * pullBatch }

// Position is where the Table says durable got to.
func (d *DB) Position(ctx context.Context, stream, durable string) (subscriber.Stored, bool, error) {
	return d.Table.Position(ctx, d.Pool, stream, durable)
}

// Holds reports whether the Table holds a token durable stored of the
// message at seq with id batchID.
func (d *DB) Holds(ctx context.Context, stream, durable string, seq uint64, batchID string) (bool, error) {
	return d.Table.Holds(ctx, d.Pool, stream, durable, seq, batchID)
}

// Hand cuts us into transactions and starts them, waiting for room.
func (d *DB) Hand(ctx context.Context, us []*subscriber.Unit, done func(...*subscriber.Unit)) error {
	d.once.Do(func() {
		// A transaction that waits for the one before holds its
		// connection: no more at once than the pool has.
		d.slots = make(chan struct{}, min(unitsAtOnce, max(int(d.Pool.Config().MaxConns), 1)))
		d.begin = storeTx(d.Pool)
	})
	for _, part := range cut(us) {
		select {
		case d.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		t := &txn{us: part, committed: make(chan struct{}), failed: make(chan struct{})}
		if d.last != nil {
			t.prevCommitted, t.prevFailed = d.last.committed, d.last.failed
		}
		d.last = t
		t.after = d.claim(t.us)
		go func() {
			defer func() { <-d.slots }()
			defer d.release(t.us)
			if d.run(ctx, t) {
				done(t.us...)
			}
		}()
	}
	return nil
}

// claim counts the keys of us in flight, reporting whether one was
// already: a message delivered again while its first delivery is being
// stored (its ack wait ran out in the pull's buffer). Its transaction
// must not insert before the earlier one committed: it would hold those
// keys while waiting for that commit, and the earlier one would wait on
// the keys, each for the other, where the database cannot see it.
func (d *DB) claim(us []*subscriber.Unit) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.keys == nil {
		d.keys = map[string]int{}
	}
	again := false
	for _, u := range us {
		for _, tok := range u.Tokens {
			n := d.keys[tok.Key]
			again = again || n > 0
			d.keys[tok.Key] = n + 1
		}
	}
	return again
}

// release uncounts the keys of us, their transaction over.
func (d *DB) release(us []*subscriber.Unit) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, u := range us {
		for _, tok := range u.Tokens {
			if n := d.keys[tok.Key]; n > 1 {
				d.keys[tok.Key] = n - 1
			} else {
				delete(d.keys, tok.Key)
			}
		}
	}
}

// cut cuts us, in order, into parts of about equal size, no smaller than
// minPartTokens tokens, at most unitsAtOnce of them but for a unit larger
// than that alone.
func cut(us []*subscriber.Unit) [][]*subscriber.Unit {
	total := 0
	for _, u := range us {
		total += len(u.Tokens)
	}
	size := max(minPartTokens, (total+unitsAtOnce-1)/unitsAtOnce)
	var parts [][]*subscriber.Unit
	from, n := 0, 0
	for i, u := range us {
		n += len(u.Tokens)
		if n >= size || i == len(us)-1 {
			parts = append(parts, us[from:i+1])
			from, n = i+1, 0
		}
	}
	return parts
}

// errAbandoned: the transaction before did not commit (the consume
// ended), so this one may not either.
var errAbandoned = errors.New("the transaction before was abandoned")

// run stores t in a transaction and commits it after the one before,
// trying again while the database cannot take it; false when t was
// abandoned.
func (d *DB) run(ctx context.Context, t *txn) bool {
	for delay, failing := 250*time.Millisecond, false; ; delay = min(2*delay, 5*time.Second) {
		added, err := d.store(ctx, t)
		if err == nil {
			if failing {
				d.log().Info("storing again", "stream_seq", t.us[0].Seq)
			}
			close(t.committed)
			d.count(t, added)
			return true
		}
		if ctx.Err() != nil || errors.Is(err, errAbandoned) {
			close(t.failed)
			return false
		}
		if !failing {
			d.log().Warn("cannot store a message; trying again, not acknowledging it meanwhile", "stream_seq", t.us[0].Seq, "err", err)
			failing = true
		}
		select {
		case <-ctx.Done():
			close(t.failed)
			return false
		case <-time.After(delay):
		}
	}
}

// store stores t's units in one transaction, committed once the one
// before committed; it returns how many tokens each unit added.
func (d *DB) store(ctx context.Context, t *txn) (added []int, err error) {
	if t.after {
		if err := t.waitPrev(ctx); err != nil {
			return nil, err
		}
	}
	err = pgx.BeginTxFunc(ctx, d.Pool, d.begin, func(tx pgx.Tx) error {
		if added, err = d.Table.StoreAll(ctx, tx, t.us); err != nil {
			return err
		}
		return t.waitPrev(ctx)
	})
	return added, err
}

// waitPrev waits for the transaction before t to commit.
func (t *txn) waitPrev(ctx context.Context) error {
	if t.prevCommitted == nil {
		return nil
	}
	select {
	case <-t.prevCommitted:
		return nil
	case <-t.prevFailed:
		return errAbandoned
	case <-ctx.Done():
		return ctx.Err()
	}
}

// count notes what t added, as it commits.
func (d *DB) count(t *txn, added []int) {
	n, again := 0, -1
	for i, u := range t.us {
		n += added[i]
		if added[i] < len(u.Tokens) && again < 0 {
			again = i
		}
	}
	d.Added.Add(int64(n))
	if again >= 0 {
		// All of it (or, cut short between parts, some) was stored by a
		// delivery whose ack never came.
		d.Again.Add(1)
		u := t.us[again]
		d.log().Info("message stored before: acknowledging it", "stream_seq", u.Seq, "batch", u.Line, "tokens", len(u.Tokens), "added", added[again])
	}
}

func (d *DB) log() *slog.Logger {
	if d.Log == nil {
		return slog.Default()
	}
	return d.Log
}
