package pgserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Server is a running PostgreSQL cluster.
type Server struct {
	Dir      string // data directory
	Port     int
	Password string
	bin      string
	cred     *syscall.Credential
	opts     []string
	log      string

	// templates holds the template databases made so far, by name.
	templatesMu sync.Mutex
	templates   map[string]bool
}

// Options adjust the server started by Start.
type Options struct {
	// Settings are extra postgresql.conf settings (name=value).
	Settings []string
	// Password, if set, is the postgres user's password, and TCP
	// connections must give it (scram-sha-256); URL includes it.
	Password string
	// TLSCert and TLSKey, if set, are PEM files the server offers TLS
	// with (ssl=on); they are copied next to the data directory.
	TLSCert, TLSKey string
}

// TB is what the database helpers (CreateDB, CreateDBFromTemplate,
// RoleExists) need of a test: testing.TB has it, and this package imports
// no testing, so a program that runs servers (cmd/bench) links none of it.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// CopyInitdb makes Start copy a data directory initdb made once (for the
// same programs and options) instead of running initdb for each server,
// until stop, which removes those directories. A test binary that starts
// many servers turns it on for its run (pgtest.Main).
func CopyInitdb() (stop func()) {
	pristine.Lock()
	pristine.on = true
	pristine.Unlock()
	return func() {
		pristine.Lock()
		defer pristine.Unlock()
		pristine.on = false
		for _, d := range pristine.dirs {
			os.RemoveAll(filepath.Dir(d))
		}
		pristine.dirs = nil
	}
}

// BinDir finds PostgreSQL's server programs: $TAILER_PG_BINDIR; for
// $TAILER_PG_VERSION (15, 16, 17 or 18) those scripts/pg-install.sh
// installs (once); else the directory of initdb on PATH, or the newest
// /usr/lib/postgresql/*/bin.
func BinDir() (string, error) {
	if d := os.Getenv("TAILER_PG_BINDIR"); d != "" {
		return d, nil
	}
	if v := os.Getenv("TAILER_PG_VERSION"); v != "" {
		return versionBinDir(v)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi < vj
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	return "", errors.New("PostgreSQL server programs not found: install postgresql (Debian) or set TAILER_PG_BINDIR")
}

// Major returns the major version of the server programs BinDir finds,
// so that a test for one version skips before it starts a server.
func Major() (int, error) {
	bin, err := BinDir()
	if err != nil {
		return 0, err
	}
	out, err := exec.Command(filepath.Join(bin, "postgres"), "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("postgres --version: %w", err)
	}
	// "postgres (PostgreSQL) 17.4 (Debian 17.4-1)"
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return 0, fmt.Errorf("postgres --version: unexpected %q", out)
	}
	major, _, _ := strings.Cut(fields[2], ".")
	n, err := strconv.Atoi(major)
	if err != nil {
		return 0, fmt.Errorf("postgres --version: unexpected %q", out)
	}
	return n, nil
}

var installed struct {
	sync.Mutex
	dirs map[string]string
}

// versionBinDir installs PostgreSQL version with scripts/pg-install.sh,
// once per process, and returns its programs' directory.
func versionBinDir(version string) (string, error) {
	installed.Lock()
	defer installed.Unlock()
	if d, ok := installed.dirs[version]; ok {
		return d, nil
	}
	_, file, _, _ := runtime.Caller(0)
	// internal/pgserver: the repository is two levels up.
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "pg-install.sh")
	var stderr strings.Builder
	cmd := exec.Command("bash", script, version)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("TAILER_PG_VERSION=%s: scripts/pg-install.sh: %v: %s", version, err, stderr.String())
	}
	if installed.dirs == nil {
		installed.dirs = map[string]string{}
	}
	installed.dirs[version] = strings.TrimSpace(string(out))
	return installed.dirs[version], nil
}

// credential returns who the server must run as: nil unless we are root.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	name := os.Getenv("TAILER_PG_USER")
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("running as root needs an unprivileged user for PostgreSQL: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// givenPorts are the ports FreePort has returned (or found taken), each with
// the lock file that keeps it ours while this process lives.
var givenPorts sync.Map

// FreePort returns a loopback TCP port that was free a moment ago and that
// no other test process is handed until this one exits. It is chosen below
// Linux's ephemeral range (32768-60999), where port 0 listeners of other
// processes land: a test that stops a server and starts it again on the
// same port must not find someone else's server there in between.
//
// go test runs several test binaries at once, and a port free when one of
// them looked can be taken by another's server before the first server
// binds it ("Address already in use" from pg_ctl start). So each port is
// claimed with an flock on a file named for it in a directory the test
// processes share; the kernel drops the lock when the process ends, however
// it ends.
func FreePort() (int, error) {
	dir := filepath.Join(os.TempDir(), "tailer-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	for i := 0; i < 200; i++ {
		port := 20000 + rand.IntN(12000)
		if _, taken := givenPorts.LoadOrStore(port, nil); taken {
			continue
		}
		lock, err := claimPort(dir, port)
		if err != nil {
			return 0, err
		}
		if lock == nil {
			continue
		}
		// Kept reachable, or its finalizer would close the file and let go
		// of the claim.
		givenPorts.Store(port, lock)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("no free port in 20000-31999")
}

// claimPort takes port's lock file in dir, or returns nil if another
// process holds it.
func claimPort(dir string, port int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("free port: claim %d: %w", port, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("free port: claim %d: %w", port, err)
	}
	return f, nil
}

// Start creates a cluster in a new temporary directory and starts it.
func Start(opts Options) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tailer-pg-")
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: filepath.Join(dir, "data"), Port: port, Password: opts.Password, bin: bin, cred: cred, log: filepath.Join(dir, "postgres.log")}
	initArgs := []string{"-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"}
	if opts.Password != "" {
		pwfile := filepath.Join(dir, "pwfile")
		if err := os.WriteFile(pwfile, []byte(opts.Password+"\n"), 0o644); err != nil {
			return nil, err
		}
		initArgs = append(initArgs, "--auth-host=scram-sha-256", "--pwfile="+pwfile)
	}
	if err := s.initdb(initArgs, opts.Password); err != nil {
		return nil, err
	}
	s.opts = append([]string{
		"listen_addresses=127.0.0.1",
		"port=" + strconv.Itoa(port),
		"unix_socket_directories=" + dir,
		"wal_level=logical",
		"max_wal_senders=20",
		"max_replication_slots=20",
		"fsync=off",
		"full_page_writes=off",
		"max_connections=100",
	}, opts.Settings...)
	if opts.TLSCert != "" {
		// PostgreSQL reads them as its own user and refuses a key that
		// others can read.
		for _, f := range []struct{ src, dst string }{{opts.TLSCert, "server.crt"}, {opts.TLSKey, "server.key"}} {
			data, err := os.ReadFile(f.src)
			if err != nil {
				return nil, err
			}
			dst := filepath.Join(dir, f.dst)
			if err := os.WriteFile(dst, data, 0o600); err != nil {
				return nil, err
			}
			if cred != nil {
				if err := os.Chown(dst, int(cred.Uid), int(cred.Gid)); err != nil {
					return nil, err
				}
			}
		}
		s.opts = append(s.opts, "ssl=on", "ssl_cert_file="+filepath.Join(dir, "server.crt"), "ssl_key_file="+filepath.Join(dir, "server.key"))
	}
	if err := s.Start(); err != nil {
		return nil, err
	}
	return s, nil
}

// pristine holds data directories initdb made, by program directory and
// password, while Main runs the tests: Start copies one and gives the copy
// a system identifier of its own instead of running initdb again, which is
// most of what starting a server costs (a test binary starts dozens).
var pristine struct {
	sync.Mutex
	on   bool
	dirs map[string]string
}

// initdb makes s's data directory: a copy of a pristine one while CopyInitdb is on
// the tests, else initdb itself. The copy needs pg_resetwal, which the
// npm builds of 16-18 lack.
func (s *Server) initdb(args []string, password string) error {
	pristine.Lock()
	defer pristine.Unlock()
	if _, err := os.Stat(filepath.Join(s.bin, "pg_resetwal")); !pristine.on || err != nil {
		if out, err := s.command("initdb", append(args, "-D", s.Dir)...).CombinedOutput(); err != nil {
			return fmt.Errorf("initdb: %v: %s", err, out)
		}
		return nil
	}
	key := s.bin + "\x00" + password
	src := pristine.dirs[key]
	if src == "" {
		dir, err := os.MkdirTemp("", "tailer-pg-pristine-")
		if err != nil {
			return err
		}
		if s.cred != nil {
			if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return err
			}
		}
		src = filepath.Join(dir, "data")
		if out, err := s.command("initdb", append(args, "-D", src)...).CombinedOutput(); err != nil {
			return fmt.Errorf("initdb: %v: %s", err, out)
		}
		if pristine.dirs == nil {
			pristine.dirs = map[string]string{}
		}
		pristine.dirs[key] = src
	}
	if out, err := exec.Command("cp", "-a", src, s.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("copy the pristine data directory: %v: %s", err, out)
	}
	return s.newSystemIdentifier()
}

// newSystemIdentifier gives a copied data directory a system identifier
// of its own, as initdb would: the tailer tells databases apart by it (a
// restored copy keeps it; another server has another). pg_control holds
// it, under a CRC-32C; pg_resetwal then writes WAL that carries it.
func (s *Server) newSystemIdentifier() error {
	path := filepath.Join(s.Dir, "global", "pg_control")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	table := crc32.MakeTable(crc32.Castagnoli)
	// The CRC covers the struct up to its own field, which ends the
	// struct; its offset differs between versions, so it is found.
	at := -1
	for off := 8; off+4 <= len(b); off += 4 {
		if crc32.Checksum(b[:off], table) == binary.LittleEndian.Uint32(b[off:]) {
			at = off
			break
		}
	}
	if at < 0 {
		return errors.New("pg_control: no CRC found")
	}
	binary.LittleEndian.PutUint64(b, uint64(time.Now().Unix())<<32|uint64(rand.Uint32()))
	binary.LittleEndian.PutUint32(b[at:], crc32.Checksum(b[:at], table))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	if out, err := s.command("pg_resetwal", "-f", "-D", s.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("pg_resetwal: %v: %s", err, out)
	}
	return nil
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

// Start starts a stopped server.
func (s *Server) Start() error {
	var o []string
	for _, kv := range s.opts {
		o = append(o, "-c "+kv)
	}
	out, err := s.command("pg_ctl", "start", "-w", "-t", "60", "-D", s.Dir, "-l", s.log, "-o", strings.Join(o, " ")).CombinedOutput()
	if err != nil {
		logTail, _ := os.ReadFile(s.log)
		return fmt.Errorf("pg_ctl start: %v: %s\n%s", err, out, logTail)
	}
	return nil
}

// Copy takes a base backup of s and starts it as a primary of its own on
// another port: the same system identifier and timeline as s, as a
// restored copy of a database has. Like every base backup, it holds no
// replication slots.
func (s *Server) Copy() (*Server, error) {
	c, err := s.backup(nil)
	if err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, err
	}
	return c, nil
}

// Standby makes a streaming standby of s from a base backup, on another
// port, replicating through s's physical slot slot (which it creates), and
// starts it. settings are added to s's (sync_replication_slots, say).
func (s *Server) Standby(slot string, settings ...string) (*Server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)`, slot); err != nil {
		return nil, fmt.Errorf("physical slot for the standby: %w", err)
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres application_name=%s", s.Port, slot)
	if s.Password != "" {
		conninfo += " password=" + s.Password
	}
	c, err := s.backup(append([]string{"hot_standby=on", "hot_standby_feedback=on", "primary_slot_name=" + slot, "primary_conninfo='" + conninfo + "'"}, settings...))
	if err != nil {
		return nil, err
	}
	if err := c.writeFile("standby.signal", ""); err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, err
	}
	return c, nil
}

// Promote ends a standby's recovery: it becomes a primary on the next
// timeline.
func (s *Server) Promote() error {
	out, err := s.command("pg_ctl", "promote", "-w", "-t", "60", "-D", s.Dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl promote: %v: %s", err, out)
	}
	return nil
}

// backup makes a base backup of s with the low-level backup API (the
// PostgreSQL builds from npm have no pg_basebackup) into a new server on
// another port, not started: the data directory copied between
// pg_backup_start and pg_backup_stop without slots, WAL or pid file, then
// the WAL written until the stop, and the backup label. settings are added
// to s's.
func (s *Server) backup(settings []string) (*Server, error) {
	dir, err := os.MkdirTemp("", "tailer-pg-copy-")
	if err != nil {
		return nil, err
	}
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return nil, err
		}
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	c := &Server{Dir: filepath.Join(dir, "data"), Port: port, Password: s.Password, bin: s.bin, cred: s.cred, log: filepath.Join(dir, "postgres.log")}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT pg_backup_start('tailer test copy', true)`); err != nil {
		return nil, fmt.Errorf("pg_backup_start: %w", err)
	}
	// Everything but the WAL (copied after the stop), the slots and the
	// running server's files; tar keeps owners and modes.
	copyDir := fmt.Sprintf("mkdir -p %[2]q && tar -C %[1]q --exclude=./pg_wal/0* --exclude=./pg_replslot/* --exclude=./postmaster.pid --exclude=./postmaster.opts -cf - . | tar -C %[2]q -xpf -", s.Dir, c.Dir)
	if out, err := exec.Command("sh", "-c", copyDir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("copy the data directory: %v: %s", err, out)
	}
	var label string
	if err := conn.QueryRow(ctx, `SELECT labelfile FROM pg_backup_stop(false)`).Scan(&label); err != nil {
		return nil, fmt.Errorf("pg_backup_stop: %w", err)
	}
	// The WAL up to the backup's end, copied after pg_backup_stop.
	wal, _ := filepath.Glob(filepath.Join(s.Dir, "pg_wal", "0*"))
	if len(wal) > 0 {
		if out, err := exec.Command("cp", append(append([]string{"-a"}, wal...), filepath.Join(c.Dir, "pg_wal"))...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("copy the WAL: %v: %s", err, out)
		}
	}
	if err := c.writeFile("backup_label", label); err != nil {
		return nil, err
	}
	for _, kv := range s.opts {
		switch {
		case strings.HasPrefix(kv, "port="):
			kv = "port=" + strconv.Itoa(port)
		case strings.HasPrefix(kv, "unix_socket_directories="):
			kv = "unix_socket_directories=" + dir
		}
		c.opts = append(c.opts, kv)
	}
	c.opts = append(c.opts, settings...)
	return c, nil
}

// writeFile writes name into the data directory, owned by the server's
// user.
func (s *Server) writeFile(name, content string) error {
	path := filepath.Join(s.Dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	if s.cred != nil {
		return os.Chown(path, int(s.cred.Uid), int(s.cred.Gid))
	}
	return nil
}

// Stop stops the server with the given pg_ctl mode (smart, fast, immediate).
func (s *Server) Stop(mode string) error {
	out, err := s.command("pg_ctl", "stop", "-w", "-t", "60", "-D", s.Dir, "-m", mode).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop: %v: %s", err, out)
	}
	return nil
}

// Close stops the server and removes its files.
func (s *Server) Close() error {
	err := s.Stop("immediate")
	os.RemoveAll(filepath.Dir(s.Dir))
	return err
}

// URL returns a connection URL for database db.
func (s *Server) URL(db string) string {
	user := "postgres"
	if s.Password != "" {
		user += ":" + url.QueryEscape(s.Password)
	}
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", user, s.Port, db)
}

var dbCounter atomic.Int64

// CreateDB creates a new empty database and returns its URL. The database
// and any replication slot left in it are dropped when the test ends.
func (s *Server) CreateDB(tb TB) string {
	tb.Helper()
	return s.createDB(tb, "")
}

// CreateDBFromTemplate creates a database for the test as a copy of the
// template database template, which setup makes (given its URL) the first
// time a test asks for it on this server. Copying a database is much
// cheaper than running the same migrations again for every test.
func (s *Server) CreateDBFromTemplate(tb TB, template string, setup func(ctx context.Context, url string) error) string {
	tb.Helper()
	s.templatesMu.Lock()
	if !s.templates[template] {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := s.exec(ctx, "CREATE DATABASE "+template)
		if err == nil {
			err = setup(ctx, s.URL(template))
		}
		cancel()
		if err != nil {
			s.templatesMu.Unlock()
			tb.Fatalf("pgserver: template database %s: %v", template, err)
		}
		if s.templates == nil {
			s.templates = map[string]bool{}
		}
		s.templates[template] = true
	}
	s.templatesMu.Unlock()
	return s.createDB(tb, template)
}

func (s *Server) createDB(tb TB, template string) string {
	tb.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbCounter.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sql := "CREATE DATABASE " + name
	if template != "" {
		// A file copy is a quarter of the time of the default, which
		// writes the whole template into the WAL.
		sql += " TEMPLATE " + template + " STRATEGY FILE_COPY"
	}
	var err error
	for range 100 {
		// A template must have no session: the one that set it up may
		// take a moment to end on the server's side.
		var pgErr *pgconn.PgError
		if err = s.exec(ctx, sql); !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.ObjectInUse {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		tb.Fatalf("pgserver: create database: %v", err)
	}
	tb.Cleanup(func() { s.dropDB(name) })
	return s.URL(name)
}

// RoleExists reports whether the server has the role.
func (s *Server) RoleExists(tb TB, role string) bool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		tb.Fatalf("pgserver: connect: %v", err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil {
		tb.Fatalf("pgserver: role %s: %v", role, err)
	}
	return exists
}

// exec runs one statement as the superuser on the postgres database.
func (s *Server) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// dropDB drops a test database and its slots, so that they do not retain
// WAL for the rest of the run. Failures only cost disk space.
func (s *Server) dropDB(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	for i := 0; i < 50; i++ {
		_, err = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = $1 AND active_pid IS NOT NULL`, name)
		if err == nil {
			_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name)
		}
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
}
