package embedded

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sys/unix"
)

// Store is the JetStream store of an embedded server, as its filesystem
// holds it.
type Store struct {
	srv *server.Server
	dir string
	// js is the JetStream configuration the server started with.
	js server.JetStreamConfig
}

// Server is the store's server.
func (s *Store) Server() *server.Server { return s.srv }

// RoomToRestart is the free space on the store's filesystem from which a
// store stopped for want of it is started again: a message block of the
// stream's, with room to spare.
const RoomToRestart = 16 << 20

// Problem says what keeps the store from taking messages ("" when
// nothing does), and starts it again once its disk has room. A write that
// finds the disk full leaves a stream with a "critical write error": the
// server neither stores nor answers any message for it again (the
// publisher's PubAck times out), or shuts JetStream down. It never
// recovers from either by itself: every publish fails until the process
// is restarted (issue 62: 230 s and 6,030 tokens waiting after the disk
// was grown). So Problem starts JetStream again, with Start's settings
// (the streams recovered from disk, as at a restart), once the filesystem
// has RoomToRestart free.
func (s *Store) Problem() string {
	broken := "JetStream was shut down"
	if s.srv.JetStreamEnabled() {
		broken = s.writeError()
		if broken == "" {
			return ""
		}
	}
	free, err := freeBytes(s.dir)
	if err != nil {
		return fmt.Sprintf("the embedded NATS server's store cannot be written (%s), and its filesystem (MAILROOM_DATA_DIR %s) cannot be looked at: %v", broken, s.dir, err)
	}
	if free < RoomToRestart {
		return fmt.Sprintf("the embedded NATS server's store is out of disk space (%s): the filesystem of MAILROOM_DATA_DIR (%s) has less than %d bytes free. "+
			"Free or grow it: the store starts again by itself once it has, and the tailer publishes what waits in the slot", broken, s.dir, RoomToRestart)
	}
	if err := s.restart(); err != nil {
		return fmt.Sprintf("the embedded NATS server's store cannot be written (%s), and it does not start again (%v), although MAILROOM_DATA_DIR (%s) has %d bytes free: restart tailer run", broken, err, s.dir, free)
	}
	return ""
}

// writeError names a stream of the store that met a write error ("":
// none has). A single server's health check looks at each.
func (s *Store) writeError() string {
	h := s.srv.Healthz(&server.HealthzOptions{Details: true})
	for _, e := range h.Errors {
		switch {
		case strings.Contains(e.Error, "no space left on device"):
			return "stream " + e.Stream + " cannot be written: no space left on device"
		case strings.Contains(e.Error, "write error"):
			return e.Error
		}
	}
	return ""
}

// restart shuts JetStream down, if it runs, and starts it again.
func (s *Store) restart() error {
	if s.srv.JetStreamEnabled() {
		if err := s.srv.ShutdownJetStream(); err != nil {
			return err
		}
	}
	js := s.js
	if err := s.srv.EnableJetStream(&js); err != nil && !s.srv.JetStreamEnabled() {
		return err
	}
	return nil
}

// freeBytes is what an unprivileged process may still write on dir's
// filesystem.
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Clean(dir), &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
