package embedded

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// lockName is the file in a data directory that its server's process
// holds locked, and in which it says where it listens.
const lockName = "tailer.lock"

// Claim is a data directory held by this process: one embedded server, and
// so one tailer, per directory. The lock goes with the process, however it
// ends.
type Claim struct {
	f *os.File
}

// InUseError is a data directory another process holds.
type InUseError struct {
	Dir string
	// PID and URL are what the holder wrote: its process and where its
	// server listens ("" when it had not said yet).
	PID, URL string
}

func (e *InUseError) Error() string {
	who := "another process"
	if e.PID != "" {
		who = "process " + e.PID
	}
	if e.URL != "" {
		who += ", its embedded NATS server at " + e.URL
	}
	return fmt.Sprintf("data directory %s is in use by %s: one tailer run per data directory", e.Dir, who)
}

// ClaimDir makes dir if need be and locks it for this process, or returns
// an *InUseError naming the process that holds it.
func ClaimDir(dir string) (*Claim, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			pid, url := readLock(dir)
			return nil, &InUseError{Dir: dir, PID: pid, URL: url}
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	return &Claim{f: f}, nil
}

// Announce writes this process's id and its server's client URL into the
// lock, for the commands that look for the running tailer (Running).
func (c *Claim) Announce(url string) error {
	if err := c.f.Truncate(0); err != nil {
		return err
	}
	_, err := c.f.WriteAt([]byte(fmt.Sprintf("pid=%d\nurl=%s\n", os.Getpid(), url)), 0)
	return err
}

// Release lets the directory go.
func (c *Claim) Release() { c.f.Close() }

// Running returns the client URL of the embedded server that the process
// holding dir announced; ok is false when no process holds dir (or it has
// not said yet).
func Running(dir string) (url string, ok bool) {
	f, err := os.Open(filepath.Join(dir, lockName))
	if err != nil {
		return "", false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err == nil {
		// Nobody holds it: what it says is a process's that is gone.
		return "", false
	}
	_, url = readLock(dir)
	return url, url != ""
}

// readLock reads what the holder of dir's lock wrote.
func readLock(dir string) (pid, url string) {
	data, err := os.ReadFile(filepath.Join(dir, lockName))
	if err != nil {
		return "", ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "pid":
			if _, err := strconv.Atoi(v); err == nil {
				pid = v
			}
		case "url":
			if strings.HasPrefix(v, "nats://") {
				url = v
			}
		}
	}
	return pid, url
}
