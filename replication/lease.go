package replication

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/mailroom/tailer/internal/pgname"
)

// Lease is the exclusive right to act on a slot: to stream from it, drop
// or create it, or publish what it (or a resync of it) holds. tailer run,
// tailer resync, an adopting tailer migrate and an automatic resync all
// take it before they look at anything, and hold it for as long as they
// act, so that no two of them interleave.
//
// The slot alone cannot be the lease: it does not exist while a resync
// drops and recreates it, and a resync holds no replication connection
// while it publishes its snapshot. The lease is a session-level advisory
// lock, held on a connection of its own so that nothing the holder does
// on its other connections can give it up. The server ends that session,
// and with it the lock, when the holder dies (its socket closes), when its
// host vanishes (TCP keepalives give up after about 25 s), or when it is
// frozen and stops pinging (idle_session_timeout): a standby can then take
// over without waiting for the holder to come back.
type Lease struct {
	// mu guards conn: the watch and the holder's writes share it.
	mu   sync.Mutex
	conn *pgx.Conn
	slot string

	stop context.CancelFunc
	done chan struct{}
	lost chan struct{}
	err  error
}

// LeaseOptions adjust AcquireLease.
type LeaseOptions struct {
	// Application names the holder in pg_stat_activity (and so in the
	// refusals of those that wait for it), e.g. "tailer run".
	Application string
	// Wait is how long to wait for a lease another holds; 0 tries once.
	// A holder that streams from the slot does not let go, so it is not
	// waited for: only one that checks the slot without streaming (a
	// tailer run waiting for a resync) or a command that ends.
	Wait time.Duration
	// Asked: the holder was asked to let go (AskHeal), and is waited for
	// even while it streams.
	Asked bool
	// Ping is how often the holder checks that it still holds the lease
	// (default 2s); Lost is closed when it does not.
	Ping time.Duration
	// IdleTimeout is how long the server keeps the lease of a holder that
	// stopped pinging (frozen, or its host gone): default 20s, well above
	// Ping, so that only such a holder loses it.
	IdleTimeout time.Duration

	// beforeLookup runs between a failed try and the lookup of the holder
	// that refusal names: tests let the holder go there.
	beforeLookup func()
}

// LeaseHeldError says another process holds the lease.
type LeaseHeldError struct {
	Slot   string
	Holder Holder
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("slot %s is owned by another process: %s", e.Slot, e.Holder)
}

// Holder describes the session holding a lease, as pg_stat_activity shows
// it to the asking role (another role's client address may be hidden).
type Holder struct {
	PID         int32
	Application string
	Client      string
	Since       time.Time
	// exiting: pg_locks still lists the lock, pg_stat_activity no longer
	// lists its session: the backend is on its way out.
	exiting bool
}

func (h Holder) String() string {
	if h.PID == 0 {
		return "a session that has just let go of it"
	}
	var b strings.Builder
	app := h.Application
	if app == "" {
		app = "unnamed client"
	}
	fmt.Fprintf(&b, "%s (backend pid %d", app, h.PID)
	if h.Client != "" {
		b.WriteString(", from " + h.Client)
	}
	if !h.Since.IsZero() {
		b.WriteString(", connected " + h.Since.UTC().Format(time.RFC3339))
	}
	b.WriteString(")")
	return b.String()
}

// leaseKey is the advisory lock's key for slot. Advisory locks are per
// database, like the tailer's tables; the key is derived from the slot name
// so that tailers of different slots in one database do not exclude each
// other.
func leaseKey(slot string) int64 {
	h := fnv.New64a()
	h.Write([]byte("tailer slot lease\x00" + slot))
	return int64(h.Sum64())
}

// lockTag is how pg_locks shows a bigint advisory key: its high and low 32
// bits as classid and objid.
func lockTag(key int64) (classid, objid int64) {
	return int64(uint64(key) >> 32), int64(uint64(key) & 0xffffffff)
}

// AcquireLease takes slot's lease on a new connection to url. When another
// process holds it, AcquireLease waits up to opts.Wait and then returns a
// *LeaseHeldError naming the holder.
func AcquireLease(ctx context.Context, url, slot string, opts LeaseOptions) (*Lease, error) {
	if err := ValidateName(slot); err != nil {
		return nil, fmt.Errorf("slot name: %w", err)
	}
	if opts.Ping <= 0 {
		opts.Ping = 2 * time.Second
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 20 * time.Second
	}
	app := opts.Application
	if app == "" {
		app = "tailer"
	}
	conn, err := Open(ctx, url, app, map[string]string{
		"idle_session_timeout":    fmt.Sprint(opts.IdleTimeout.Milliseconds()),
		"tcp_keepalives_idle":     "10",
		"tcp_keepalives_interval": "5",
		"tcp_keepalives_count":    "3",
	})
	if err != nil {
		return nil, err
	}
	key := leaseKey(slot)
	deadline := time.Now().Add(opts.Wait)
	vanished := 0
	for {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got); err != nil {
			conn.Close(context.Background())
			return nil, fmt.Errorf("take the lease of slot %s: %w", slot, err)
		}
		if got {
			break
		}
		streaming := false
		if opts.Wait > 0 && !opts.Asked {
			s, err := Slot(ctx, conn, slot)
			streaming = err == nil && s.Active
		}
		if streaming || !time.Now().Before(deadline) {
			if opts.beforeLookup != nil {
				opts.beforeLookup()
			}
			holder, err := leaseHolder(ctx, conn, key)
			if err == nil && (holder.PID == 0 || holder.exiting) && vanished < 10 {
				// The holder let go between the try and the lookup, or
				// its backend is exiting: the lease is free, or about to
				// be, and a refusal would name nobody.
				vanished++
				if holder.exiting {
					time.Sleep(100 * time.Millisecond)
				}
				continue
			}
			conn.Close(context.Background())
			if err != nil {
				return nil, err
			}
			return nil, &LeaseHeldError{Slot: slot, Holder: holder}
		}
		select {
		case <-ctx.Done():
			conn.Close(context.Background())
			return nil, ctx.Err()
		case <-time.After(min(200*time.Millisecond, time.Until(deadline))):
		}
	}
	pingCtx, stop := context.WithCancel(context.Background())
	l := &Lease{conn: conn, slot: slot, stop: stop, done: make(chan struct{}), lost: make(chan struct{})}
	go l.watch(pingCtx, key, opts.Ping, opts.IdleTimeout/2)
	return l, nil
}

// watch checks every ping that the lease is still held, and closes lost
// when it is not (or cannot be told).
func (l *Lease) watch(ctx context.Context, key int64, ping, patience time.Duration) {
	defer close(l.done)
	t := time.NewTicker(ping)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var held bool
		qctx, cancel := context.WithTimeout(ctx, patience)
		classid, objid := lockTag(key)
		l.mu.Lock()
		err := l.conn.QueryRow(qctx, `SELECT `+heldSQL, classid, objid).Scan(&held)
		l.mu.Unlock()
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil && !held {
			err = errors.New("the server no longer shows it held")
		}
		if err != nil {
			l.err = fmt.Errorf("lost the lease of slot %s: %w", l.slot, err)
			close(l.lost)
			return
		}
	}
}

// heldSQL is true while the asking session holds the lease whose key's
// lock tag is ($1, $2).
const heldSQL = `EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
	AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1 AND granted)`

// SetConfirmLimit records in the slot's record (in schema) that the
// holder may confirm the slot up to at, on the
// lease's own connection and only while it holds the lease: written
// before the holder confirms past it, so that a slot confirmed further
// was advanced by another process (a tailer of another schema configured
// with the same slot, a slot advanced by hand). It never moves the limit
// back, and fails when the lease is no longer held.
func (l *Lease) SetConfirmLimit(ctx context.Context, schema pgname.Schema, at pglogrepl.LSN) error {
	classid, objid := lockTag(leaseKey(l.slot))
	l.mu.Lock()
	defer l.mu.Unlock()
	var held bool
	err := l.conn.QueryRow(ctx, `WITH limited AS (
			UPDATE `+schema.Name("tailer_slot")+` SET confirm_limit = $4::pg_lsn
			WHERE slot = $3 AND (confirm_limit IS NULL OR confirm_limit < $4::pg_lsn) AND `+heldSQL+`
			RETURNING 1)
		SELECT `+heldSQL, classid, objid, l.slot, at.String()).Scan(&held)
	if err == nil && !held {
		err = errors.New("the lease is no longer held")
	}
	if err != nil {
		return fmt.Errorf("record how far slot %s may be confirmed: %w", l.slot, err)
	}
	return nil
}

// Lost is closed when the lease was lost (its connection failed or was
// ended): the holder must stop acting on the slot at once.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err says why the lease was lost, once Lost is closed.
func (l *Lease) Err() error {
	select {
	case <-l.lost:
		return l.err
	default:
		return nil
	}
}

// Release gives the lease up. It unlocks before it closes the connection:
// the server drops a closed session's locks only once its backend has
// seen the close, and a waiter looking in between would be refused for a
// holder that has already let go.
func (l *Lease) Release() {
	l.stop()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Err() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		// On failure the close below ends the session, and the lock with it.
		l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, leaseKey(l.slot))
		cancel()
	}
	l.conn.Close(context.Background())
}

// LeaseHolder returns who holds slot's lease, and false when nobody does.
func LeaseHolder(ctx context.Context, q Querier, slot string) (Holder, bool, error) {
	h, err := leaseHolder(ctx, q, leaseKey(slot))
	if err != nil {
		return h, false, err
	}
	return h, h.PID != 0, nil
}

func leaseHolder(ctx context.Context, q Querier, key int64) (Holder, error) {
	var (
		h      Holder
		app    *string
		client *string
		since  *time.Time
	)
	classid, objid := lockTag(key)
	err := q.QueryRow(ctx, `
		SELECT l.pid, a.pid IS NULL, a.application_name, host(a.client_addr), a.backend_start
		FROM pg_locks l
		LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid AND l.objsubid = 1
		LIMIT 1`, classid, objid).Scan(&h.PID, &h.exiting, &app, &client, &since)
	if errors.Is(err, pgx.ErrNoRows) {
		return Holder{}, nil
	}
	if err != nil {
		return h, fmt.Errorf("look up who holds the lease: %w", err)
	}
	if app != nil {
		h.Application = *app
	}
	if client != nil {
		h.Client = *client
	}
	if since != nil {
		h.Since = *since
	}
	return h, nil
}

// TailerRuns lists the backends of tailer run processes connected to the
// database, by the application names they connect with, but the asking
// session's: a tailer run that waits for a resync to let go of the slot
// is among them, and goes on by itself once it does.
func TailerRuns(ctx context.Context, q Querier) ([]int32, error) {
	var pids []int32
	err := q.QueryRow(ctx, `SELECT coalesce(array_agg(pid ORDER BY pid), '{}') FROM pg_stat_activity
		WHERE datname = current_database() AND application_name IN ('tailer', 'tailer run') AND pid <> pg_backend_pid()`).Scan(&pids)
	if err != nil {
		return nil, fmt.Errorf("list tailer run sessions: %w", err)
	}
	return pids, nil
}
