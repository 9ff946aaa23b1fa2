package inbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/publish/subscriber"
)

// gatedTable fails to store the batches of the message at seq until open.
type gatedTable struct {
	Table
	seq  uint64
	open atomic.Bool
}

func (g *gatedTable) StoreAll(ctx context.Context, tx pgx.Tx, us []*subscriber.Unit) ([]int, error) {
	for _, u := range us {
		if u.Seq == g.seq && !g.open.Load() {
			return nil, errors.New("the database cannot take it now")
		}
	}
	return g.Table.StoreAll(ctx, tx, us)
}

// The transactions of a DB commit in the order they were cut, whatever
// order they finish storing in: a message stored while one before it is
// not would be where a lost consumer is made again, past the one not
// stored (Position). One that cannot store holds back those after it;
// each batch is done once its transaction committed.
func TestTransactionsCommitInOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := inboxPool(ctx, t)
	store := &gatedTable{Table: Inbox{}, seq: 1}
	d := &DB{Pool: pool, Table: store, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var (
		mu   sync.Mutex
		done []uint64
	)
	finished := func(us ...*subscriber.Unit) {
		mu.Lock()
		defer mu.Unlock()
		for _, u := range us {
			done = append(done, u.Seq)
		}
	}
	for seq := uint64(1); seq <= 3; seq++ {
		// Each message alone, a transaction of its own, as a pull of one
		// at a time would hand them.
		if err := d.Hand(ctx, testBatch(int(seq)*10, 2).Units("S", seq, "d"), finished); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM mailroom_inbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	time.Sleep(time.Second)
	mu.Lock()
	early := slices.Clone(done)
	mu.Unlock()
	if n := stored(); n != 0 || len(early) != 0 {
		t.Fatalf("with message 1 not stored: %d rows, batches done of messages %v; want none of either", n, early)
	}
	store.open.Store(true)
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(done)
		mu.Unlock()
		if n == 6 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := stored(); n != 6 {
		t.Fatalf("%d rows, want 6", n)
	}
	mu.Lock()
	defer mu.Unlock()
	// Said done as each commits, from the transaction's own goroutine:
	// in any order, each once.
	slices.Sort(done)
	if !slices.Equal(done, []uint64{1, 1, 2, 2, 3, 3}) {
		t.Fatalf("batches done of messages %v, want [1 1 2 2 3 3]: each once", done)
	}
}

// Batches at hand are cut into parts in order, at batch boundaries, no
// smaller than minPartTokens but to end, at most unitsAtOnce but for a
// batch larger than a part alone.
func TestCut(t *testing.T) {
	for _, tc := range []struct {
		sizes []int
		want  [][]int
	}{
		{[]int{3}, [][]int{{3}}},
		{[]int{10, 10, 10}, [][]int{{10, 10, 10}}},
		{[]int{1000, 1000}, [][]int{{1000}, {1000}}},
		{[]int{600, 600, 600, 600, 600}, [][]int{{600, 600}, {600, 600}, {600}}},
		{[]int{300, 300, 300, 300, 300, 300, 300, 300}, [][]int{{300, 300}, {300, 300}, {300, 300}, {300, 300}}},
		{[]int{5000, 1, 1}, [][]int{{5000}, {1, 1}}},
	} {
		var us []*subscriber.Unit
		for i, n := range tc.sizes {
			us = append(us, &subscriber.Unit{Seq: uint64(i), Tokens: make([]subscriber.SignedToken, n)})
		}
		var got [][]int
		seen := 0
		for _, part := range cut(us) {
			var sizes []int
			for _, u := range part {
				if u.Seq != uint64(seen) {
					t.Fatalf("%v: batch %d where %d comes next", tc.sizes, u.Seq, seen)
				}
				seen++
				sizes = append(sizes, len(u.Tokens))
			}
			got = append(got, sizes)
		}
		if !slices.EqualFunc(got, tc.want, slices.Equal) {
			t.Errorf("cut %v = %v, want %v", tc.sizes, got, tc.want)
		}
	}
}

// A transaction done is let go: the sink keeps the newest transaction to
// chain the next one to, not every one of its run (a chain of them from
// the newest kept a drain's every token in memory: 170-216 MiB peak
// against 42-52 in the bench).
func TestTransactionsLetGo(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := inboxPool(ctx, t)
	d := &DB{Pool: pool, Table: Inbox{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var done atomic.Int32
	finished := func(us ...*subscriber.Unit) { done.Add(int32(len(us))) }
	first := testBatch(1000, 2).Units("S", 1, "d")
	seen := weak.Make(first[0])
	if err := d.Hand(ctx, first, finished); err != nil {
		t.Fatal(err)
	}
	first = nil
	for seq := uint64(2); seq <= 4; seq++ {
		if err := d.Hand(ctx, testBatch(1000+int(seq)*10, 2).Units("S", seq, "d"), finished); err != nil {
			t.Fatal(err)
		}
	}
	for done.Load() < 8 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	runtime.GC()
	runtime.GC()
	if seen.Value() != nil {
		t.Fatal("the first transaction's batch is still held after three more transactions committed")
	}
	// The sink lives on, as a subscriber's does.
	runtime.KeepAlive(d)
}

// heldTable holds the transaction storing first until release, and says
// when any other transaction has stored.
type heldTable struct {
	Table
	first   *subscriber.Unit
	release chan struct{}
	other   chan struct{}
	once    sync.Once
}

func (h *heldTable) StoreAll(ctx context.Context, tx pgx.Tx, us []*subscriber.Unit) ([]int, error) {
	if slices.Contains(us, h.first) {
		<-h.release
		return h.Table.StoreAll(ctx, tx, us)
	}
	added, err := h.Table.StoreAll(ctx, tx, us)
	h.once.Do(func() { close(h.other) })
	return added, err
}

// A message delivered again while its first delivery's transaction is
// in flight (its ack wait ran out in the pull's buffer) is stored after
// that one committed. Stored first, the later transaction would hold its
// tokens' keys while it waits for the earlier one's commit, and the
// earlier one would wait on those keys: both stuck, the database unable
// to see it, the subscriber stalled with no error.
func TestDeliveredAgainWhileInFlight(t *testing.T) {
	t.Parallel()
	for _, table := range []struct {
		name string
		t    func(*testing.T) Table
	}{
		{"inbox", func(*testing.T) Table { return Inbox{} }},
		{"river", func(t *testing.T) Table {
			j, err := NewJobs("")
			if err != nil {
				t.Fatal(err)
			}
			return j
		}},
	} {
		t.Run(table.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pool := inboxPool(ctx, t)
			if err := MigrateRiver(ctx, pool, ""); err != nil {
				t.Fatal(err)
			}
			first := testBatch(1, 4).Units("S", 1, "d")
			again := testBatch(1, 4).Units("S", 1, "d")
			held := &heldTable{Table: table.t(t), first: first[0], release: make(chan struct{}), other: make(chan struct{})}
			d := &DB{Pool: pool, Table: held, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			var done atomic.Int32
			finished := func(us ...*subscriber.Unit) { done.Add(int32(len(us))) }
			if err := d.Hand(ctx, first, finished); err != nil {
				t.Fatal(err)
			}
			if err := d.Hand(ctx, again, finished); err != nil {
				t.Fatal(err)
			}
			// Stored now, the delivery again would hold the keys the first
			// one's transaction is about to insert.
			select {
			case <-held.other:
			case <-time.After(time.Second):
			}
			close(held.release)
			for done.Load() < 4 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			if n := done.Load(); n != 4 {
				t.Fatalf("%d of 4 batches done after a minute: the two transactions wait for each other", n)
			}
			if n, again := d.Added.Load(), d.Again.Load(); n != 4 || again != 1 {
				t.Fatalf("added %d tokens in %d transactions that found theirs stored, want 4 in 1", n, again)
			}
		})
	}
}

// A subscriber frozen (SIGSTOP) with a transaction holding tokens' keys,
// waiting for the one before it to commit, does not hold back the standby
// that takes the durable over: the server ends the frozen one's session
// once it is idle in its transaction for IdleInTransaction (here 1 s), and
// the standby stores the tokens. Without it the standby waits on the keys
// for as long as the frozen process lives.
func TestFrozenTransactionLetsGo(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.Shared(t).CreateDB(t)
	frozenPool, err := Connect(ctx, url+"&"+idleParam+"=1000")
	if err != nil {
		t.Fatal(err)
	}
	// Closed once the sinks' transactions ended with ctx.
	t.Cleanup(frozenPool.Close)
	if err := Migrate(ctx, frozenPool, ""); err != nil {
		t.Fatal(err)
	}
	// The frozen subscriber: its first transaction never stores, the
	// second stored and waits for the first.
	before := testBatch(1, 2).Units("S", 1, "d")
	held := &heldTable{Table: Inbox{}, first: before[0], release: make(chan struct{}), other: make(chan struct{})}
	defer close(held.release)
	frozen := &DB{Pool: frozenPool, Table: held, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	nothing := func(...*subscriber.Unit) {}
	if err := frozen.Hand(ctx, before, nothing); err != nil {
		t.Fatal(err)
	}
	if err := frozen.Hand(ctx, testBatch(10, 2).Units("S", 2, "d"), nothing); err != nil {
		t.Fatal(err)
	}
	<-held.other

	pool, err := Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var idle string
	if err := pool.QueryRow(ctx, `SHOW `+idleParam).Scan(&idle); err != nil {
		t.Fatal(err)
	}
	if idle != "1min" {
		t.Fatalf("Connect's sessions have %s = %s, want 1min (IdleInTransaction)", idleParam, idle)
	}
	standby := &DB{Pool: pool, Table: Inbox{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var done atomic.Int32
	if err := standby.Hand(ctx, testBatch(10, 2).Units("S", 2, "d"), func(us ...*subscriber.Unit) { done.Add(int32(len(us))) }); err != nil {
		t.Fatal(err)
	}
	for done.Load() < 2 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if n := done.Load(); n != 2 {
		t.Fatalf("the standby stored %d of 2 batches in a minute: it waits on the frozen subscriber's keys", n)
	}
	if n := standby.Added.Load(); n != 2 {
		t.Fatalf("the standby added %d tokens, want 2", n)
	}
}

// Two subscribers storing the same messages (a durable handed over while
// the one before is still storing) can wait for each other where the
// database cannot see it: A's first transaction waits on a key B's
// inserted, B's waits on a key A's second inserted, and A's second waits,
// idle in its transaction, for A's first to commit. The store's lock
// wait ends at LockWait, B's transaction is stored again, and every
// batch is done; without it the cycle lasts until the server ends A's
// idle session (IdleInTransaction, a minute).
func TestTwoSubscribersWaitingForEachOther(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := pgtest.Shared(t).CreateDB(t)
	connect := func() *pgxpool.Pool {
		pool, err := Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	poolA, poolB := connect(), connect()
	if err := Migrate(ctx, poolA, ""); err != nil {
		t.Fatal(err)
	}
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	var done atomic.Int32
	finished := func(us ...*subscriber.Unit) { done.Add(int32(len(us))) }

	// A: message 1 held back, message 2 stored and waiting for it.
	one := testBatch(1, 2).Units("S", 1, "d")
	held := &heldTable{Table: Inbox{}, first: one[0], release: make(chan struct{}), other: make(chan struct{})}
	a := &DB{Pool: poolA, Table: held, Log: discard}
	if err := a.Hand(ctx, one, finished); err != nil {
		t.Fatal(err)
	}
	if err := a.Hand(ctx, testBatch(10, 2).Units("S", 2, "d"), finished); err != nil {
		t.Fatal(err)
	}
	<-held.other
	// B: both messages in one transaction; it inserts message 1's keys,
	// then waits on message 2's.
	b := &DB{Pool: poolB, Table: Inbox{}, Log: discard}
	both := append(testBatch(1, 2).Units("S", 1, "d"), testBatch(10, 2).Units("S", 2, "d")...)
	if err := b.Hand(ctx, both, finished); err != nil {
		t.Fatal(err)
	}
	// This database's sessions only: other tests share the server.
	for waiting := 0; waiting == 0 && ctx.Err() == nil; time.Sleep(10 * time.Millisecond) {
		if err := poolA.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	// A's message 1 now waits on B's keys.
	start := time.Now()
	close(held.release)
	for done.Load() < 8 && time.Since(start) < 30*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	if n := done.Load(); n != 8 {
		t.Fatalf("%d of 8 batches done %v after the cycle closed: the two subscribers wait for each other", n, time.Since(start).Round(time.Second))
	}
	var rows int
	if err := poolA.QueryRow(ctx, `SELECT count(*) FROM public.mailroom_inbox`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if added := a.Added.Load() + b.Added.Load(); rows != 4 || added != 4 {
		t.Fatalf("%d rows, %d tokens added; want 4 of each", rows, added)
	}
	// A URL that sets lock_timeout keeps it.
	set, err := Connect(ctx, url+"&"+lockParam+"=0")
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	if q := storeTx(set).BeginQuery; q != "" {
		t.Errorf("with %s in the URL, a store begins with %q, want the default BEGIN", lockParam, q)
	}
}
