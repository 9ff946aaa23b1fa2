package pgserver

// Servers made from another: a copy of its data directory, and a standby
// streaming from it (promoted by Promote).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

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
