package pgtest

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mailroom/tailer/internal/pgserver"
)

// Server and Options are pgserver's: the tests' servers are the same
// programs cmd/bench runs.
type (
	Server  = pgserver.Server
	Options = pgserver.Options
)

// Start, FreePort, BinDir and Major are pgserver's, for the tests.
func Start(opts Options) (*Server, error) { return pgserver.Start(opts) }
func FreePort() (int, error)              { return pgserver.FreePort() }
func BinDir() (string, error)             { return pgserver.BinDir() }
func Major() (int, error)                 { return pgserver.Major() }

// pool holds the servers Shared hands out, each to one test at a time.
var pool struct {
	mu   sync.Mutex
	all  []*Server
	free []*Server
	held map[string]*Server // by test name
}

// Shared returns a server for the test to use alone until it ends, starting
// one when every server started so far is held by another test. Tests that
// run in parallel get servers of their own: replication slots are the
// server's, not a database's, and two tests' slots named "mailroom" must not
// meet. A subtest gets its parent's server. Tests using it must call Main
// from TestMain so that the servers are stopped afterwards.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	pool.mu.Lock()
	for name := tb.Name(); ; {
		if s := pool.held[name]; s != nil {
			pool.mu.Unlock()
			return s
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			break
		}
		name = name[:i]
	}
	var s *Server
	if n := len(pool.free); n > 0 {
		s, pool.free = pool.free[n-1], pool.free[:n-1]
	}
	pool.mu.Unlock()
	if s == nil {
		// A small logical_decoding_work_mem makes the server stream large
		// transactions (protocol v2), so tests exercise that path for real.
		var err error
		if s, err = Start(Options{Settings: []string{"logical_decoding_work_mem=64kB"}}); err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
		pool.mu.Lock()
		pool.all = append(pool.all, s)
		pool.mu.Unlock()
	}
	pool.mu.Lock()
	if pool.held == nil {
		pool.held = map[string]*Server{}
	}
	pool.held[tb.Name()] = s
	pool.mu.Unlock()
	// Registered before the test's databases are made, so it runs after
	// they (and their slots) are dropped.
	tb.Cleanup(func() {
		pool.mu.Lock()
		delete(pool.held, tb.Name())
		pool.free = append(pool.free, s)
		pool.mu.Unlock()
	})
	return s
}

// Main runs the tests and stops the servers Shared started. While it runs,
// Start copies data directories instead of running initdb for each.
func Main(m *testing.M) int {
	stopCopies := pgserver.CopyInitdb()
	defer stopCopies()
	code := m.Run()
	pool.mu.Lock()
	defer pool.mu.Unlock()
	for _, s := range pool.all {
		s.Close()
	}
	return code
}

// Querier is the part of pgx.Conn the helpers below use.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Exec runs sql and fails the test on error.
func Exec(tb testing.TB, ctx context.Context, q Querier, sql string, args ...any) {
	tb.Helper()
	if _, err := q.Exec(ctx, sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

// WalLSN returns pg_current_wal_lsn().
func WalLSN(tb testing.TB, ctx context.Context, q Querier) pglogrepl.LSN {
	tb.Helper()
	var s string
	if err := q.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		tb.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		tb.Fatal(err)
	}
	return lsn
}
