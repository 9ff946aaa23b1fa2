package subscriber

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mailroom/tailer/internal/pause"
)

// ErrReaderGone is returned when the reader of a pipe has closed it.
var ErrReaderGone = errors.New("the reader of the pipe is gone")

// Pipe is the write end of a pipe, as seen by its writer: whether its
// reader has taken what was written, and whether the reader is still there.
type Pipe struct{ f *os.File }

// OpenPipe returns f as a Pipe; ok is false when f is not a pipe.
func OpenPipe(f *os.File) (p *Pipe, ok bool) {
	p = &Pipe{f: f}
	var st unix.Stat_t
	if err := p.control(func(fd int) error { return unix.Fstat(fd, &st) }); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return nil, false
	}
	return p, true
}

// control runs fn on the pipe's descriptor; once the file is closed it
// fails rather than reach a descriptor reused by another file.
func (p *Pipe) control(fn func(fd int) error) error {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// fill is how many bytes the pipe holds (FIONREAD works on either end).
func (p *Pipe) fill() (int, error) {
	var n int
	err := p.control(func(fd int) (err error) {
		n, err = unix.IoctlGetInt(fd, unix.TIOCINQ)
		return err
	})
	return n, err
}

// Taken waits until the reader has taken every byte written (the pipe
// holds none: FIONREAD on either end counts them), or fails with
// ErrReaderGone once the reader has closed the pipe with bytes in it. A
// reader that took the bytes and then left did take them.
//
// The answer is the pipe's, looked at after ctx ends too: a reader that
// takes a line and exits at once (a sender that fails on it) ends ctx
// through the subscriber's watch on the pipe, and failing then would leave
// the batch before that line in doubt, to be written again by the next
// reader and charged with the failure.
func (p *Pipe) Taken(ctx context.Context) error {
	wait := 100 * time.Microsecond
	for {
		n, err := p.fill()
		if err != nil {
			return fmt.Errorf("read the pipe's fill (FIONREAD): %w", err)
		}
		if n == 0 {
			return nil
		}
		if p.Gone() {
			return ErrReaderGone
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// Ended early by ctx, the wait is followed by a last look.
		_ = pause.For(ctx, wait)
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// Unread is how many bytes written the reader has not taken (0 when that
// cannot be read).
func (p *Pipe) Unread() int {
	n, err := p.fill()
	if err != nil {
		return 0
	}
	return n
}

// Gone reports whether the reader has closed the pipe (poll shows POLLERR
// on the write end of a pipe without readers).
func (p *Pipe) Gone() bool {
	var revents int16
	err := p.control(func(fd int) error {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		_, err := unix.Poll(fds, 0)
		revents = fds[0].Revents
		return err
	})
	return err == nil && revents&(unix.POLLERR|unix.POLLHUP) != 0
}
