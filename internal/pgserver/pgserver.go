package pgserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
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
