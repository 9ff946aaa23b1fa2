package subscriber

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ReaderWaits reports whether the pipe's reader waits for more: the pipe
// is empty, and every process that holds its read end (but this one) has
// every thread asleep, blocked reading the pipe or waiting for a child,
// at least one reading it. That is the reader's own word, read from
// /proc: a reader that takes more input only when it is done with what it
// holds (the pipe rule) has finished every line it took, the last one
// too. A process that cannot be looked at, a thread doing anything else
// (sending mail, reading ahead into a queue, polling) is no word: false.
func (p *Pipe) ReaderWaits() bool {
	if p.Unread() != 0 {
		return false
	}
	var st unix.Stat_t
	if err := p.control(func(fd int) error { return unix.Fstat(fd, &st) }); err != nil {
		return false
	}
	target := fmt.Sprintf("pipe:[%d]", st.Ino)
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	self, reading := os.Getpid(), false
	for _, d := range procs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == self || !holds(pid, target) {
			continue
		}
		r, ok := asleepOnPipe(pid)
		if !ok {
			return false
		}
		reading = reading || r
	}
	return reading
}

// holds reports whether process pid has target among its descriptors.
func holds(pid int, target string) bool {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	fds, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if link, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && link == target {
			return true
		}
	}
	return false
}

// asleepOnPipe reports whether every thread of pid sleeps reading a pipe
// or waiting for a child (ok), and whether one reads a pipe.
func asleepOnPipe(pid int) (reading, ok bool) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil || len(tasks) == 0 {
		return false, false
	}
	for _, t := range tasks {
		wchan, err := os.ReadFile(filepath.Join(dir, t.Name(), "wchan"))
		if err != nil {
			return false, false
		}
		switch w := string(wchan); {
		case strings.Contains(w, "pipe_read"), w == "pipe_wait":
			reading = true
		case w == "do_wait":
		default:
			return false, false
		}
	}
	return reading, true
}
