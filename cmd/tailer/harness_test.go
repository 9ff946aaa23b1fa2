// The process-test harness: the tailer binary, a database and NATS
// server per test (cluster), the processes run against them (proc), and the
// waits on what they publish.

package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mailroom/tailer/internal/embedded"
	"github.com/mailroom/tailer/internal/testutil/pgtest"
	"github.com/mailroom/tailer/internal/testutil/tailertest"
	"github.com/mailroom/tailer/migrations/migratetest"
	"github.com/mailroom/tailer/publish/wire/wiretest"
	"github.com/mailroom/tailer/replication"
)

// tailerBin is the tailer built once for the fault tests, which run it as a
// real process so that it can be killed. With TAILER_CHILD_RACE=1 it is
// built with the race detector (make test-soak, in CI), so that the daemon
// runs under it through crashes, takeovers and outages; every test then
// fails on a race report in a child's output.
var tailerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tailer-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tailerBin = filepath.Join(dir, "tailer")
	build := []string{"build", "-o", tailerBin}
	if os.Getenv("TAILER_CHILD_RACE") == "1" {
		build = append(build, "-race")
	}
	if out, err := exec.Command("go", append(build, ".")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build tailer: %v\n%s", err, out)
		os.Exit(1)
	}
	if err := lookups.start(); err != nil {
		fmt.Fprintln(os.Stderr, "record lookups:", err)
		os.Exit(1)
	}
	code := pgtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// cluster is a database, a restartable NATS server and the tailers run
// against them.
type cluster struct {
	*migratetest.DB
	t        *testing.T
	ctx      context.Context
	natsDir  string
	natsPort int
	nats     *server.Server
	// natsOpts are what the test's own connections need (credentials).
	natsOpts []nats.Option
	// natsURLs, when set, replaces the one server's URL (a NATS cluster).
	natsURLs string
	// streamName, when set, is the stream the test reads instead of
	// MAILROOM; tokens, the tokens table whose rows it expects there
	// instead of public's.
	streamName, tokens string
	limit              int
	timeout            time.Duration
	// streamCache keeps the stream's messages between polls.
	streamCache wiretest.StreamCache
	// writers counts the writers started: each names its accounts apart.
	writers atomic.Int32
}

func newCluster(t *testing.T, pg *pgtest.Server, limit int, timeout time.Duration) *cluster {
	t.Helper()
	c := newClusterWithoutSlot(t, pg, limit, timeout)
	if _, err := replication.CreateSlot(c.ctx, replication.SchemaConn{Querier: c.Conn, Schema: "public"}, "mailroom", "tailer migrate", false, false); err != nil {
		t.Fatal(err)
	}
	return c
}

// newClusterWithoutSlot is newCluster before tailer migrate made the slot.
func newClusterWithoutSlot(t *testing.T, pg *pgtest.Server, limit int, timeout time.Duration) *cluster {
	t.Helper()
	// Bounded by the test binary's -timeout: a soak runs for longer than
	// any fixed bound would allow.
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Minute)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	t.Cleanup(cancel)
	db := migratetest.NewDB(t, pg)
	port, err := pgtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{DB: db, t: t, ctx: ctx, natsDir: t.TempDir(), natsPort: port, limit: limit, timeout: timeout}
	c.startNATS()
	t.Cleanup(c.stopNATS)
	return c
}

func (c *cluster) natsURL() string {
	if c.natsURLs != "" {
		return c.natsURLs
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", c.natsPort)
}

func (c *cluster) startNATS() {
	c.t.Helper()
	s, err := embedded.Start(c.natsDir, fmt.Sprintf("127.0.0.1:%d", c.natsPort))
	if err != nil {
		c.t.Fatal(err)
	}
	c.nats = s
}

func (c *cluster) stopNATS() {
	if c.nats != nil {
		c.nats.Shutdown()
		c.nats.WaitForShutdown()
		c.nats = nil
	}
}

// proc is a running tailer process.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	out  *tailertest.Buffer
	done chan struct{}
	err  error
}

func (c *cluster) tailer(extraEnv ...string) *proc {
	c.t.Helper()
	args := []string{"run"}
	if !slices.ContainsFunc(extraEnv, func(e string) bool { return strings.HasPrefix(e, "MAILROOM_HTTP_ADDR=") }) {
		// Tests run in parallel packages: no fixed HTTP port.
		args = append(args, "--http-addr=")
	}
	return c.command(args, extraEnv...)
}

// command starts the tailer binary with args, configured for the cluster.
func (c *cluster) command(args []string, extraEnv ...string) *proc {
	c.t.Helper()
	return c.commandOf(tailerBin, args, extraEnv...)
}

// commandOf is command with the tailer binary bin (another release's).
func (c *cluster) commandOf(bin string, args []string, extraEnv ...string) *proc {
	c.t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(),
		"MAILROOM_DATABASE_URL="+c.URL,
		"MAILROOM_SECRET_KEY="+goodKey,
		"MAILROOM_NATS_URL="+c.natsURL(),
		"MAILROOM_BATCH_LIMIT="+strconv.Itoa(c.limit),
		"MAILROOM_BATCH_TIMEOUT="+strconv.Itoa(int(c.timeout/time.Millisecond)),
		"MAILROOM_LOG_LEVEL=info",
	)
	cmd.Env = append(cmd.Env, extraEnv...)
	p := &proc{t: c.t, cmd: cmd, out: &tailertest.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	c.t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		noRace(c.t, p)
		if c.t.Failed() {
			c.t.Logf("tailer pid %d output:\n%s", cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

// serverMajor is the PostgreSQL server's major version.
func (c *cluster) serverMajor() int {
	c.t.Helper()
	var n int
	if err := c.Conn.QueryRow(c.ctx, `SELECT current_setting('server_version_num')::int / 10000`).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

// waitLog waits until the process has logged s (count times).
func (p *proc) waitLog(s string, count int, within time.Duration) {
	p.t.Helper()
	tailertest.Eventually(p.t, within, func() error {
		out := p.out.String()
		if strings.Count(out, s) >= count {
			return nil
		}
		select {
		case <-p.done:
			p.t.Fatalf("tailer exited (%v) before logging %q:\n%s", p.err, s, out)
		default:
		}
		return fmt.Errorf("tailer did not log %q:\n%s", s, out)
	})
}

// noRace fails the test if the race detector reported in the process's
// output: a process killed by the test never reaches the exit status (66)
// that would say so.
func noRace(t *testing.T, p *proc) {
	t.Helper()
	if out := p.out.String(); strings.Contains(out, "WARNING: DATA RACE") {
		t.Errorf("tailer pid %d: the race detector reported:\n%s", p.cmd.Process.Pid, out)
	}
}

func (p *proc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// freeze stops the process (SIGSTOP) and returns once every thread of it
// has stopped, so nothing it reads or sends after this call.
func (p *proc) freeze() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		p.t.Fatal(err)
	}
	tailertest.Eventually(p.t, 10*time.Second, func() error {
		stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", p.cmd.Process.Pid))
		if err != nil || len(stats) == 0 {
			return fmt.Errorf("threads of pid %d: %v", p.cmd.Process.Pid, err)
		}
		for _, f := range stats {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			// The state follows the command name, which is in parentheses.
			rest := string(b[bytes.LastIndexByte(b, ')')+1:])
			if state := strings.Fields(rest); len(state) == 0 || (state[0] != "T" && state[0] != "t") {
				return fmt.Errorf("%s: not stopped: %s", f, b)
			}
		}
		return nil
	})
}

// thaw lets a frozen process go on (SIGCONT).
func (p *proc) thaw() {
	p.cmd.Process.Signal(syscall.SIGCONT)
}

// term sends SIGTERM and returns the exit code.
func (p *proc) term(within time.Duration) int {
	p.t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(within):
		p.t.Fatalf("tailer did not exit within %s of SIGTERM:\n%s", within, p.out.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

func (c *cluster) slot() replication.SlotInfo {
	c.t.Helper()
	s, err := replication.Slot(c.ctx, c.Conn, "mailroom")
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// writer inserts accounts (each with an activation token) until stopped.
type writer struct {
	stop  chan struct{}
	done  chan struct{}
	count atomic.Int64
	err   error
}

func (c *cluster) startWriter(perTx int, pause time.Duration) *writer {
	return c.startMixedWriter(perTx, 0, pause)
}

// startMixedWriter also inserts recoveries password recovery tokens per
// transaction, for accounts made active beforehand.
func (c *cluster) startMixedWriter(perTx, recoveries int, pause time.Duration) *writer {
	c.t.Helper()
	conn, err := pgx.Connect(c.ctx, c.URL)
	if err != nil {
		c.t.Fatal(err)
	}
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	id := c.writers.Add(1)
	go func() {
		defer close(w.done)
		defer conn.Close(context.Background())
		for n := 0; ; n++ {
			select {
			case <-w.stop:
				return
			default:
			}
			err := pgx.BeginFunc(c.ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(c.ctx, `INSERT INTO accounts (email, login)
					SELECT 'w' || $3::int || '_' || $1::int || '_' || g || '@example.com', 'w' || $3::int || '_' || $1::int || '_' || g FROM generate_series(1, $2::int) g`, n, perTx, id); err != nil {
					return err
				}
				if recoveries == 0 {
					return nil
				}
				_, err := tx.Exec(c.ctx, `INSERT INTO tokens (account, action)
					SELECT id, 'password_recovery' FROM accounts WHERE status = 'active' ORDER BY random() LIMIT $1`, recoveries)
				return err
			})
			if err != nil {
				w.err = err
				return
			}
			w.count.Add(int64(perTx + recoveries))
			time.Sleep(pause)
		}
	}()
	c.t.Cleanup(w.halt)
	return w
}

func (w *writer) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// stream opens the MAILROOM stream on a NATS connection of its own, which
// the returned function closes. The error is the stream lookup's.
func (c *cluster) stream() (jetstream.Stream, func(), error) {
	c.t.Helper()
	nc, err := nats.Connect(c.natsURL(), c.natsOpts...)
	if err != nil {
		c.t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		c.t.Fatal(err)
	}
	// A request a cluster without a leader never answers must not hang
	// the test's polling.
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	name := c.streamName
	if name == "" {
		name = "MAILROOM"
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return s, nc.Close, nil
}

// messages reads the whole stream; nil while it cannot be read.
func (c *cluster) messages() []*jetstream.RawStreamMsg {
	c.t.Helper()
	stream, done, err := c.stream()
	if err != nil {
		return nil
	}
	defer done()
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	msgs, err := c.streamCache.Messages(ctx, stream)
	if err != nil {
		c.t.Log(err)
		return nil
	}
	return msgs
}

// tokenCounts reads the whole stream and counts each token id.
func (c *cluster) tokenCounts() map[int64]int {
	c.t.Helper()
	counts := map[int64]int{}
	for _, m := range c.messages() {
		ids, err := wiretest.TokenIDs(m)
		if err != nil {
			c.t.Fatal(err)
		}
		for _, id := range ids {
			counts[id]++
		}
	}
	return counts
}

// expectExactlyOnce waits until every token in the table is on the stream
// and fails on any token published twice.
func (c *cluster) expectExactlyOnce(within time.Duration) int {
	c.t.Helper()
	var want []int64
	rows, _ := c.Conn.Query(c.ctx, `SELECT id FROM `+cmp.Or(c.tokens, "public.tokens")+` ORDER BY id`)
	want, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		c.t.Fatal(err)
	}
	tailertest.Eventually(c.t, within, func() error {
		counts := c.tokenCounts()
		for id, n := range counts {
			if n > 1 {
				c.t.Fatalf("token %d published %d times", id, n)
			}
		}
		missing := 0
		for _, id := range want {
			if counts[id] == 0 {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d tokens never reached the stream", missing, len(want))
		}
		return nil
	})
	return len(want)
}

// tailerWithHTTP starts a tailer that serves /metrics and /readyz on a
// port of its own, and returns it with their base URL.
func (c *cluster) tailerWithHTTP(extraEnv ...string) (*proc, string) {
	c.t.Helper()
	port, err := pgtest.FreePort()
	if err != nil {
		c.t.Fatal(err)
	}
	p := c.tailer(append([]string{fmt.Sprintf("MAILROOM_HTTP_ADDR=127.0.0.1:%d", port)}, extraEnv...)...)
	return p, fmt.Sprintf("http://127.0.0.1:%d", port)
}

// waitPending waits until the tailer at base holds n tokens read from the
// WAL and not yet published (tailer_tokens_pending): the batch a test is
// about is in the making.
func (c *cluster) waitPending(base string, n int) {
	c.t.Helper()
	tailertest.Eventually(c.t, 10*time.Second, func() error {
		_, page := httpGet(base + "/metrics")
		if v, _ := metricValue(page, "tailer_tokens_pending"); v < float64(n) {
			return fmt.Errorf("tailer_tokens_pending %v, want %d", v, n)
		}
		return nil
	})
}

// httpGet returns the status code and body of a GET, or 0 when the request
// failed.
func httpGet(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grepLines(page, substr string) string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// metricValue reads one unlabelled sample from a /metrics page.
func metricValue(page, name string) (float64, bool) {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// status runs tailer status --json against the cluster.
func (c *cluster) status(maxLag int64) (statusReport, int) {
	c.t.Helper()
	return c.statusWith(maxLag)
}

// statusWith runs tailer status --json against the cluster, with env
// after the cluster's settings.
func (c *cluster) statusWith(maxLag int64, env ...string) (statusReport, int) {
	c.t.Helper()
	cmd := exec.Command(tailerBin, "status", "--json", "--max-lag", strconv.FormatInt(maxLag, 10))
	cmd.Env = append(append(os.Environ(), "MAILROOM_DATABASE_URL="+c.URL, "MAILROOM_NATS_URL="+c.natsURL()), env...)
	out, _ := cmd.Output()
	var rep statusReport
	if err := json.Unmarshal(out, &rep); err != nil {
		c.t.Fatalf("tailer status --json: %v: %s", err, out)
	}
	return rep, cmd.ProcessState.ExitCode()
}

// publishThenStop runs a tailer until n new accounts' tokens (emails
// prefix1@x...) are on the stream exactly once, then stops it gracefully.
func (c *cluster) publishThenStop(prefix string, n int) {
	c.t.Helper()
	tp := c.tailer()
	tp.waitLog("streaming", 1, 20*time.Second)
	c.Exec(`INSERT INTO accounts (email, login) SELECT $1 || g || '@x', $1 || g FROM generate_series(1, $2::int) g`, prefix, n)
	c.expectExactlyOnce(30 * time.Second)
	if code := tp.term(15 * time.Second); code != 0 {
		c.t.Fatalf("tailer exit %d after SIGTERM", code)
	}
}

// exit waits for the process to exit on its own and returns its code.
func (p *proc) exit(within time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		p.t.Fatalf("tailer still running after %s:\n%s", within, p.out.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// ownServer starts a PostgreSQL server of t's own (one a test stops,
// restarts or copies, apart from the shared one), closed at t's end.
func ownServer(t *testing.T) *pgtest.Server {
	t.Helper()
	srv, err := pgtest.Start(pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}
